//go:build race

package cluster

// raceDetector is true when the tests run with -race: the memory soak,
// too slow and too distorted under it, skip.
const raceDetector = true

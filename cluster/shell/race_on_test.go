//go:build race

package shell

// raceDetector is true when the tests run with -race: the memory soak,
// too slow and too distorted under it, skip.
const raceDetector = true

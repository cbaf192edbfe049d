//go:build !race

package cluster

// raceDetector is true when the tests run with -race.
const raceDetector = false

//go:build !race

package shell

// raceDetector is true when the tests run with -race.
const raceDetector = false

//go:build !race

package weir_test

// raceDetector is true when the tests run with -race.
const raceDetector = false

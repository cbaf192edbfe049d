//go:build race

package weir_test

// raceDetector is true when the tests run with -race: the memory soaks,
// too slow and too distorted under it, skip.
const raceDetector = true

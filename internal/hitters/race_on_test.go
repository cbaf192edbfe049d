//go:build race

package hitters

// raceEnabled shrinks the large single-goroutine tests under -race, which
// slows them tenfold without checking anything more in them.
const raceEnabled = true

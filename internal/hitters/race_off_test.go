//go:build !race

package hitters

const raceEnabled = false

//go:build !linux

package main

import "time"

// cpuTime is not measured on this platform.
func cpuTime() (time.Duration, bool) { return 0, false }

// loadAverage is not measured on this platform.
func loadAverage() (float64, bool) { return 0, false }

//go:build linux

package main

import (
	"syscall"
	"time"
)

// cpuTime is the CPU time (user + system) the process has used.
func cpuTime() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}

// loadAverage is the system's one-minute load average.
func loadAverage() (float64, bool) {
	var si syscall.Sysinfo_t
	if err := syscall.Sysinfo(&si); err != nil {
		return 0, false
	}
	return float64(si.Loads[0]) / (1 << 16), true
}

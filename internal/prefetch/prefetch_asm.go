//go:build amd64 || arm64

package prefetch

// Line asks the CPU to start loading the cache line at addr and returns
// at once: a hint with no effect on what any code observes (it is not a
// read in the memory model, so it cannot race, and it never faults, even on
// an address no longer mapped), used to overlap a likely cache miss with
// the work before the read that needs the line.
func Line(addr uintptr)

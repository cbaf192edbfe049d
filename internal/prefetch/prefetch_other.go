//go:build !amd64 && !arm64

package prefetch

// Line is a no-op where no prefetch instruction is wired up; see
// prefetch_asm.go.
func Line(addr uintptr) {}

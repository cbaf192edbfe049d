//go:build !amd64 && !arm64

package cluster

// prefetch is a no-op where no prefetch instruction is wired up; see
// prefetch_asm.go.
func prefetch(addr uintptr) {}

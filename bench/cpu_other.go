//go:build !unix

package main

import "time"

// processCPU is 0 where getrusage is missing: figures per CPU-second are
// then not reported.
func processCPU() time.Duration { return 0 }

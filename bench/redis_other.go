//go:build !linux

package main

import (
	"os/exec"
	"time"
)

// dieWithParent does nothing where the kernel offers no parent-death
// signal: Stop ends the server at the end of a run.
func dieWithParent(*exec.Cmd) {}

// childCPU is 0 where /proc is missing: a server's CPU is then not counted.
func childCPU(int) time.Duration { return 0 }

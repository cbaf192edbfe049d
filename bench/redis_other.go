//go:build !linux

package main

import "os/exec"

// dieWithParent does nothing where the kernel offers no parent-death
// signal: Stop ends the server at the end of a run.
func dieWithParent(*exec.Cmd) {}

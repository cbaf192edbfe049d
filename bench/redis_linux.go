package main

import (
	"bytes"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"
)

// dieWithParent makes the kernel kill the child when this process dies, so
// that an interrupted run leaves no redis-server behind.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// clockTicks is the unit of /proc/PID/stat's CPU times (USER_HZ, 100 on
// every architecture Linux builds for).
const clockTicks = 100

// childCPU is the CPU time (user and system) process pid has used so far,
// read from /proc/PID/stat (utime and stime, fields 14 and 15); 0 when it
// cannot be read. Its resolution is 10 ms.
func childCPU(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The command name (field 2) is in parentheses and may hold spaces:
	// the fields after it start after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := bytes.Fields(b[i+1:]) // f[0] is field 3 (state)
	if len(f) < 13 {
		return 0
	}
	u, err1 := strconv.ParseInt(string(f[11]), 10, 64)
	s, err2 := strconv.ParseInt(string(f[12]), 10, 64)
	if err1 != nil || err2 != nil {
		return 0
	}
	return time.Duration(u+s) * time.Second / clockTicks
}

package main

import "syscall"

// childAttr puts the command in a process group of its own and has the
// kernel kill it when seminit dies.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

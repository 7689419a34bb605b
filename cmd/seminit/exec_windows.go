package main

import (
	"os"
	"syscall"
)

// childAttr starts the command in a process group of its own, so that the
// console's Ctrl-C reaches seminit, which decides what the command gets.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{CreationFlags: syscall.CREATE_NEW_PROCESS_GROUP}
}

// stopGroup stops the command. Windows has no SIGTERM to send a process:
// it is killed at once (its children are not reached).
func stopGroup(p *os.Process) { _ = p.Kill() }

// killGroup kills the command.
func killGroup(p *os.Process) { _ = p.Kill() }

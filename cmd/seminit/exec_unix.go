//go:build unix

package main

import (
	"os"
	"syscall"
)

// stopGroup sends SIGTERM to the command's process group.
func stopGroup(p *os.Process) { _ = syscall.Kill(-p.Pid, syscall.SIGTERM) }

// killGroup sends SIGKILL to the command's process group.
func killGroup(p *os.Process) { _ = syscall.Kill(-p.Pid, syscall.SIGKILL) }

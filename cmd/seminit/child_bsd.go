//go:build unix && !linux

package main

import (
	"os/exec"
	"syscall"
)

// childAttr puts the command in a process group of its own. These systems
// have no parent-death signal: if seminit is SIGKILLed, the command runs on
// (a clean exit of seminit still stops it).
func childAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

// terminal is Linux's (child_linux.go): here the command never gets the
// terminal, and runs in the background as a job of seminit's.
type terminal struct{ childFd int }

func controllingTerminal(*exec.Cmd) *terminal { return nil }

func (*terminal) close()   {}
func (*child) started()    {}
func (*child) jobControl() {}
func raiseDieBy()          {}

//go:build unix && !linux

package main

import "syscall"

// childAttr puts the command in a process group of its own. These systems
// have no parent-death signal: if seminit is SIGKILLed, the command runs on
// (a clean exit of seminit still stops it).
func childAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

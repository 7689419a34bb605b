package main

import (
	"os/exec"
	"syscall"
)

// terminal is Linux's (child_linux.go).
type terminal struct{}

func raiseDieBy() {}

// startChild starts the command in a process group of its own, so that the
// console's Ctrl-C reaches seminit, which passes it on.
func startChild(cmd *exec.Cmd) (*child, error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{CreationFlags: syscall.CREATE_NEW_PROCESS_GROUP}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, exited: make(chan error, 1), pgid: cmd.Process.Pid}
	go func() { c.exited <- cmd.Wait() }()
	return c, nil
}

// signal stops the command: Windows has no signals to pass on, and
// kills it at once (its children are not reached).
func (c *child) signal(syscall.Signal) { _ = c.cmd.Process.Kill() }

func (c *child) stop() { _ = c.cmd.Process.Kill() }

func (c *child) kill() { _ = c.cmd.Process.Kill() }

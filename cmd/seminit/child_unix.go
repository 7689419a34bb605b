//go:build unix

package main

import (
	"os/exec"
	"syscall"
)

// startChild starts the command in a process group of its own: in the
// terminal's foreground if seminit has it there (see terminal), in the
// background otherwise.
func startChild(cmd *exec.Cmd) (*child, error) {
	cmd.SysProcAttr = childAttr()
	c := &child{cmd: cmd, exited: make(chan error, 1), term: controllingTerminal(cmd)}
	if c.term != nil && c.term.childFd >= 0 {
		cmd.SysProcAttr.Foreground = true
		cmd.SysProcAttr.Ctty = c.term.childFd
	}
	if err := cmd.Start(); err != nil {
		if c.term != nil {
			c.term.close()
		}
		return nil, err
	}
	c.pgid = cmd.Process.Pid
	if c.term != nil {
		c.started()
		go c.jobControl()
	} else {
		go func() { c.exited <- cmd.Wait() }()
	}
	return c, nil
}

// signal passes a stop signal on to the command's process group, then
// SIGCONT (as timeout(1) does): a stopped command acts on it at once.
func (c *child) signal(sig syscall.Signal) {
	_ = syscall.Kill(-c.pgid, sig)
	_ = syscall.Kill(-c.pgid, syscall.SIGCONT)
}

func (c *child) stop() { c.signal(syscall.SIGTERM) }

func (c *child) kill() { _ = syscall.Kill(-c.pgid, syscall.SIGKILL) }

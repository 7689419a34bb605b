package main

import (
	"errors"
	"os/exec"
	"strconv"
	"syscall"
	"time"
)

// A child is exec's command, run while seminit holds its permit. It runs
// in a process group of its own. Stop signals to seminit reach it as
// themselves (signalRouter); seminit stops it on its own account only when
// the permit is lost or --max-hold runs out (stopChild). Where seminit has
// a controlling terminal (Linux), job control works as if the command ran
// without seminit: the command gets the terminal's foreground when seminit
// has it, and stops and continues with seminit's job (see terminal).
type child struct {
	cmd    *exec.Cmd
	pgid   int
	term   *terminal  // the terminal the command has; nil when none
	exited chan error // the command's end, once: nil, or an error childExit reads
}

// exitStatus is the end of a command that seminit waited for itself
// (see child.jobControl), for childExit.
type exitStatus struct{ ws syscall.WaitStatus }

func (e exitStatus) Error() string {
	if e.ws.Signaled() {
		return "killed by " + e.ws.Signal().String()
	}
	return "exit status " + strconv.Itoa(e.ws.ExitStatus())
}

// stopChild stops the command on seminit's account: SIGTERM (then SIGCONT,
// for a stopped one) to its process group, SIGKILL after grace. It returns
// the command's end.
func stopChild(c *child, grace time.Duration) error {
	c.stop()
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case err := <-c.exited:
		return err
	case <-t.C:
		c.kill()
		return <-c.exited
	}
}

// childExit converts the command's end into seminit's exit: the command's
// own code, or 128+signal when a signal ended it.
func childExit(err error) error {
	if err == nil {
		return nil
	}
	var ws syscall.WaitStatus
	var es exitStatus
	var ee *exec.ExitError
	switch {
	case errors.As(err, &es):
		ws = es.ws
	case errors.As(err, &ee):
		w, ok := ee.Sys().(syscall.WaitStatus)
		if !ok {
			return exitCodeErr{code: ee.ExitCode()}
		}
		ws = w
	default:
		return exitCodeErr{code: exitFailure, err: err}
	}
	if ws.Signaled() {
		return exitCodeErr{code: 128 + int(ws.Signal())}
	}
	if ws.ExitStatus() == 0 {
		return nil
	}
	return exitCodeErr{code: ws.ExitStatus()}
}

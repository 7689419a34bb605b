package main

import (
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// childAttr puts the command in a process group of its own and has the
// kernel kill it when seminit dies: a command that outlived its permit's
// holder would run unprotected once the permit is handed on.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// A terminal is seminit's controlling terminal, which it shares with
// exec's command as a shell shares it with a job. Started in the
// foreground, the command's process group gets the terminal's foreground:
// it reads the terminal and gets the keyboard's signals (Ctrl-C, Ctrl-\,
// Ctrl-Z) itself, as it would without seminit. When the command stops
// (Ctrl-Z, or a read of the terminal from the background), seminit takes
// the terminal back if the command had it and stops its own process group
// with the same signal, so the shell sees its job stopped; fg or bg
// continues both (suspend). When the command ends, seminit takes the
// terminal back.
type terminal struct {
	fd      int  // seminit's descriptor of the terminal
	childFd int  // the command's (0, 1 or 2)
	pgrp    int  // seminit's process group
	fg      bool // seminit's group had the foreground when the command started
}

// controllingTerminal returns the first of the command's standard streams
// that is seminit's controlling terminal, or nil: no terminal (pipes,
// files), or no controlling one. All three streams must be files (seminit
// then waits for the command itself).
func controllingTerminal(cmd *exec.Cmd) *terminal {
	streams := []any{cmd.Stdin, cmd.Stdout, cmd.Stderr}
	for _, s := range streams {
		if _, ok := s.(*os.File); !ok {
			return nil
		}
	}
	pgrp := syscall.Getpgrp()
	for i, s := range streams {
		fd := int(s.(*os.File).Fd())
		// TIOCGPGRP answers only for the caller's controlling terminal.
		if fg, err := unix.IoctlGetInt(fd, unix.TIOCGPGRP); err == nil {
			return &terminal{fd: fd, childFd: i, pgrp: pgrp, fg: fg == pgrp}
		}
	}
	return nil
}

// foreground returns the terminal's foreground process group (-1 if it
// cannot tell).
func (t *terminal) foreground() int {
	fg, err := unix.IoctlGetInt(t.fd, unix.TIOCGPGRP)
	if err != nil {
		return -1
	}
	return fg
}

// give puts process group pgid in the terminal's foreground. seminit is in
// the background when it takes the terminal back, and the kernel would stop
// it with SIGTTOU: the signal is blocked on the calling thread meanwhile
// (blocked, not ignored: an ignored signal would stay ignored in commands
// seminit starts later).
func (t *terminal) give(pgid int) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var block, old unix.Sigset_t
	n := uint(syscall.SIGTTOU) - 1
	block.Val[n/64] |= 1 << (n % 64)
	if err := unix.PthreadSigmask(unix.SIG_BLOCK, &block, &old); err != nil {
		return
	}
	defer func() { _ = unix.PthreadSigmask(unix.SIG_SETMASK, &old, nil) }()
	_ = unix.IoctlSetPointerInt(t.fd, unix.TIOCSPGRP, pgid)
}

// jobControl waits for the command, stopped as well as ended: it suspends
// seminit with a stopped command, and takes the terminal back from one
// that ended.
func (c *child) jobControl() {
	pid := c.cmd.Process.Pid
	for {
		var ws syscall.WaitStatus
		_, err := syscall.Wait4(pid, &ws, syscall.WUNTRACED, nil)
		switch {
		case err == syscall.EINTR:
			continue
		case err != nil:
			c.exited <- err
			return
		case ws.Stopped():
			c.suspend(ws.StopSignal())
			continue
		}
		if c.term.foreground() == c.pgid {
			c.term.give(c.term.pgrp)
		}
		_ = c.cmd.Process.Release()
		if ws.Exited() && ws.ExitStatus() == 0 {
			c.exited <- nil
		} else {
			c.exited <- exitStatus{ws}
		}
		return
	}
}

// suspend handles a command stopped by sig as a shell would have, had it
// run the command itself. A command that wanted the terminal from the
// background (SIGTTIN, SIGTTOU) while seminit has the foreground (fg after
// a start in the background) gets it and goes on. Otherwise seminit takes
// the terminal back if the command had it, and stops its own process group
// (the shell's job: seminit and the rest of its pipeline) with the same
// signal (SIGTSTP for SIGSTOP, which only a signal from outside sends), so
// the shell sees the job stopped. Once continued (fg, bg), it gives the
// terminal to the command if the shell gave it to seminit, and continues
// the command. In an orphaned process group, which the kernel does not
// stop, the command is continued after a pause.
func (c *child) suspend(sig syscall.Signal) {
	t := c.term
	wantsTerminal := sig == syscall.SIGTTIN || sig == syscall.SIGTTOU
	switch fg := t.foreground(); {
	case fg == t.pgrp && wantsTerminal:
	case fg == c.pgid:
		t.give(t.pgrp)
		fallthrough
	default:
		if sig == syscall.SIGSTOP {
			sig = syscall.SIGTSTP
		}
		_ = syscall.Kill(0, sig)
	}
	if t.foreground() == t.pgrp {
		t.give(c.pgid)
	} else {
		// In the background (bg), the command stops again at its next
		// read of the terminal, and so does seminit: the shell's usual
		// way with a job that wants input.
		time.Sleep(100 * time.Millisecond)
	}
	_ = syscall.Kill(-c.pgid, syscall.SIGCONT)
}

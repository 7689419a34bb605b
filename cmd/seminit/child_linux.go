package main

import (
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"sync/atomic"
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
// exec's command as a shell shares it with a job, so that job control
// works as if the command ran without seminit:
//   - Started in the foreground, the command's process group gets the
//     terminal's foreground: it reads the terminal and gets the keyboard's
//     signals (Ctrl-C, Ctrl-\, Ctrl-Z) itself.
//   - A command that wants the terminal from the background (SIGTTIN,
//     SIGTTOU: started with &, then fg) gets it once seminit has it.
//   - When the command stops (Ctrl-Z), seminit takes the terminal back and
//     stops its own process group, so the shell sees its job stopped; fg
//     or bg continues both (suspend).
//   - A process of seminit's own job (a pager after it in a pipeline) that
//     reads the terminal while the command has it gets it (readers).
//   - When the command ends, seminit takes the terminal back; if Ctrl-C or
//     Ctrl-\ killed it, seminit's job gets the signal too, as it would have
//     without seminit, so a script running seminit stops (dieBy).
type terminal struct {
	tty     *os.File       // /dev/tty, open while the command runs
	fd      int            // tty's descriptor
	childFd int            // the command's stream that is the terminal when it starts in the foreground; -1 if none
	pgrp    int            // seminit's process group
	ttin    chan os.Signal // SIGTTIN and SIGTTOU to seminit's job
	cont    chan os.Signal // SIGCONT to seminit's job (fg, bg)
	// wants says the command stopped wanting the terminal while seminit's
	// job was in the background: the shell's fg hands it over (handOver).
	wants atomic.Bool
}

// controllingTerminal returns seminit's controlling terminal, or nil: none,
// or one of the command's standard streams is no file (seminit then lets
// os/exec wait for the command). When seminit's group has the foreground,
// childFd is the command's stream that is the terminal, if any.
func controllingTerminal(cmd *exec.Cmd) *terminal {
	streams := []any{cmd.Stdin, cmd.Stdout, cmd.Stderr}
	for _, s := range streams {
		if _, ok := s.(*os.File); !ok {
			return nil
		}
	}
	tty, err := os.OpenFile("/dev/tty", os.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	rc, err := tty.SyscallConn()
	if err != nil {
		_ = tty.Close()
		return nil
	}
	fd := -1
	_ = rc.Control(func(f uintptr) { fd = int(f) })
	t := &terminal{tty: tty, fd: fd, childFd: -1, pgrp: syscall.Getpgrp(),
		ttin: make(chan os.Signal, 1), cont: make(chan os.Signal, 1)}
	// Before the command starts: a pager after seminit in a pipeline may
	// read the terminal at once.
	signal.Notify(t.ttin, syscall.SIGTTIN, syscall.SIGTTOU)
	signal.Notify(t.cont, syscall.SIGCONT)
	if t.foreground() != t.pgrp {
		return t
	}
	var ttySt unix.Stat_t
	if unix.Fstat(fd, &ttySt) != nil {
		return t
	}
	for i, s := range streams {
		var st unix.Stat_t
		if unix.Fstat(int(s.(*os.File).Fd()), &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == ttySt.Rdev {
			t.childFd = i
			break
		}
	}
	return t
}

// close releases what the terminal holds once the command has ended (or
// did not start).
func (t *terminal) close() {
	signal.Stop(t.ttin)
	signal.Stop(t.cont)
	_ = t.tty.Close()
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

// started finishes the handover once the command runs: a command with no
// stream on the terminal (all redirected) that may still open /dev/tty
// (a password prompt, a pager) gets the foreground now, as one started
// with a stream on it got it at exec.
func (c *child) started() {
	if t := c.term; t.childFd < 0 && t.foreground() == t.pgrp {
		t.give(c.pgid)
	}
}

// jobControl waits for the command, stopped as well as ended (see
// terminal).
func (c *child) jobControl() {
	t := c.term
	stopReaders := make(chan struct{})
	readersDone := make(chan struct{})
	go func() {
		defer close(readersDone)
		c.readers(stopReaders)
	}()
	defer func() {
		close(stopReaders)
		<-readersDone
		t.close()
	}()
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
		hadTerminal := t.foreground() == c.pgid
		if hadTerminal {
			t.give(t.pgrp)
		}
		if sig := ws.Signal(); hadTerminal && ws.Signaled() && (sig == syscall.SIGINT || sig == syscall.SIGQUIT) {
			// The keyboard would have signalled seminit's whole job had
			// the command not had a process group of its own: do so,
			// and end by it (main).
			dieBy.Store(int32(sig))
			_ = syscall.Kill(0, sig)
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

// readers handles, until stop, SIGTTIN and SIGTTOU to seminit's own job: a
// process of it (a pager after seminit in a pipeline) reads the terminal
// while the command has it. It gets the terminal; in the background, the
// job stops, as it would have without the handler. And SIGCONT: the
// shell's fg of a job whose command waits for the terminal (handOver).
func (c *child) readers(stop <-chan struct{}) {
	t := c.term
	for {
		select {
		case <-stop:
			return
		case <-t.cont:
			if t.foreground() == t.pgrp {
				c.handOver()
			}
			continue
		case <-t.ttin:
		}
		if t.foreground() == c.pgid {
			t.give(t.pgrp)
			_ = syscall.Kill(0, syscall.SIGCONT)
		} else if t.foreground() != t.pgrp {
			stopJob(syscall.SIGTSTP)
		}
	}
}

// suspend handles a command stopped by sig as a shell would have, had it
// run the command itself (see terminal). It decides who gets the terminal
// only once seminit is continued (stopJob): deciding before raced the
// shell's bg, which could hand the terminal to a background command. In an
// orphaned process group, which the kernel does not stop, it goes on after
// a second.
func (c *child) suspend(sig syscall.Signal) {
	t := c.term
	fg := t.foreground()
	if sig == syscall.SIGTTIN || sig == syscall.SIGTTOU {
		switch fg {
		case t.pgrp: // fg after a start in the background
			t.give(c.pgid)
			fallthrough
		case c.pgid: // stopped before the terminal was handed to it
			_ = syscall.Kill(-c.pgid, syscall.SIGCONT)
		default:
			// In the background (started with &, or bg): the command
			// waits, stopped, for the shell's fg, which gives seminit's
			// job the terminal and a SIGCONT (readers hands it over
			// then, or at once if that came first). Until then the job
			// stops, so the shell says it wants input; it is checked
			// just before, as a fg since the command stopped must not
			// be undone by a stop that comes after it. A fg between the
			// check and the stop taking hold is not caught (the kernel
			// stops a job in the background atomically only through a
			// SIGTTIN or SIGTTOU at its default action, which the
			// handler os/signal installs for readers replaces): the shell
			// then shows the job stopped, and the next fg goes on.
			t.wants.Store(true)
			if t.foreground() != t.pgrp {
				stopJob(syscall.SIGTSTP)
			}
			if t.foreground() == t.pgrp {
				c.handOver()
			}
		}
		return
	}
	if fg == c.pgid {
		t.give(t.pgrp)
	}
	if sig == syscall.SIGSTOP {
		sig = syscall.SIGTSTP // SIGSTOP only comes from outside; the shell's fg continues a SIGTSTP
	}
	stopJob(sig)
	if t.foreground() == t.pgrp {
		t.give(c.pgid)
	}
	_ = syscall.Kill(-c.pgid, syscall.SIGCONT)
}

// stopJob stops seminit's job with sig, a stop signal (every process of
// seminit's process group gets it: a pager after seminit in a pipeline
// stops with it), and returns once seminit has been continued, or after a
// second in an orphaned process group, where the kernel drops the stop.
// kill(2) returns before the stop takes hold: the kernel wakes one thread
// to take a signal sent to the whole process, the main one if it can,
// which a loaded machine may run only milliseconds later. A caller that
// went on to decide who gets the terminal raced the shell: a fg it saw
// was undone by the late stop (the command handed the terminal, then
// seminit's job stopped in the foreground and the shell took the terminal
// back), and a bg could leave the command with the terminal.
func stopJob(sig syscall.Signal) {
	cont := make(chan os.Signal, 1)
	signal.Notify(cont, syscall.SIGCONT)
	defer signal.Stop(cont)
	_ = syscall.Kill(0, sig)
	select {
	case <-cont:
	case <-time.After(time.Second):
	}
}

// handOver gives the terminal to a command that waits for it (wants) and
// continues it; once, whoever of suspend and readers comes first.
func (c *child) handOver() {
	if c.term.wants.CompareAndSwap(true, false) {
		c.term.give(c.pgid)
		_ = syscall.Kill(-c.pgid, syscall.SIGCONT)
	}
}

// dieBy is the signal seminit ends by, as its command did (jobControl):
// main raises it on itself once everything is released.
var dieBy atomic.Int32

// raiseDieBy ends seminit by the signal jobControl recorded, if any, as
// timeout(1) does: the shell and a script running seminit see it killed by
// SIGINT or SIGQUIT ($? is still 128+N). It returns if there is none.
func raiseDieBy() {
	sig := syscall.Signal(dieBy.Load())
	if sig == 0 {
		return
	}
	signal.Reset(sig)
	if sig == syscall.SIGQUIT {
		_ = syscall.Setrlimit(syscall.RLIMIT_CORE, &syscall.Rlimit{}) // no core dump of seminit's own
	}
	runtime.LockOSThread()
	_ = syscall.Tgkill(os.Getpid(), syscall.Gettid(), sig)
	time.Sleep(time.Second) // the signal ends the process
}

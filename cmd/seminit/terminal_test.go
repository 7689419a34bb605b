//go:build linux

package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tokensem/tokensem/internal/semtest"
)

// A shell is an interactive bash on a pseudo-terminal of its own, as a
// user at a terminal runs seminit: bash leads the session, has job
// control, and puts each command line's job in the terminal's foreground.
type shell struct {
	t    *testing.T
	pty  *os.File // the terminal's master side: what the user types and sees
	out  semtest.SyncBuffer
	seen int // how much of out the expectations have consumed
}

// startShell starts `bash -i` with env on a new pseudo-terminal. The
// cleanup ends it (and, by the terminal's hangup, its jobs).
func startShell(t *testing.T, env []string) *shell {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	// Through SyscallConn, not Fd, which would make the master blocking:
	// a blocking Read cannot be ended by Close, and the cleanup must end
	// it even while a stray process still holds the terminal open.
	rc, err := master.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if cerr := rc.Control(func(fd uintptr) {
		if err = unix.IoctlSetPointerInt(int(fd), unix.TIOCSPTLCK, 0); err == nil {
			n, err = unix.IoctlGetInt(int(fd), unix.TIOCGPTN)
		}
	}); cerr != nil || err != nil {
		t.Fatalf("unlock pty: %v %v", cerr, err)
	}
	slave, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open pty: %v", err)
	}
	sh := &shell{t: t, pty: master}
	cmd := exec.Command("bash", "--norc", "--noprofile", "--noediting", "-i")
	cmd.Env = append(env, "PS1=$ ", "TERM=dumb", "PATH="+filepath.Dir(seminitBin)+":"+os.Getenv("PATH"))
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start bash: %v", err)
	}
	_ = slave.Close()
	read := make(chan struct{})
	go func() {
		defer close(read)
		buf := make([]byte, 4096)
		for {
			n, err := master.Read(buf)
			_, _ = sh.out.Write(buf[:n])
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGHUP)
		killSession(cmd.Process.Pid) // what a failed test left running under it
		_ = cmd.Wait()
		_ = master.Close()
		<-read
		if t.Failed() {
			t.Logf("terminal:\n%s", sh.out.String())
		}
	})
	sh.expect("$ ")
	return sh
}

// killSession SIGKILLs every process of session sid (bash and its jobs).
func killSession(sid int) {
	procs, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		// "pid (comm) state ppid pgrp session ...", comm may hold ')'.
		i := strings.LastIndexByte(string(b), ')')
		f := strings.Fields(string(b[i+1:]))
		if len(f) > 3 && f[3] == strconv.Itoa(sid) {
			pid, _ := strconv.Atoi(strings.Fields(string(b))[0])
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// typeIn writes keys to the terminal as the user types them.
func (sh *shell) typeIn(keys string) {
	sh.t.Helper()
	if _, err := sh.pty.WriteString(keys); err != nil {
		sh.t.Fatalf("type %q: %v", keys, err)
	}
}

// expect waits until the terminal shows want after what earlier
// expectations consumed, and consumes up to its end.
func (sh *shell) expect(want string) {
	sh.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		out := sh.out.String()
		if i := strings.Index(out[sh.seen:], want); i >= 0 {
			sh.seen += i + len(want)
			return
		}
		if time.Now().After(deadline) {
			sh.t.Fatalf("the terminal did not show %q within 30s; after the last expectation it shows:\n%s", want, out[sh.seen:])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// status echoes the last command's exit status and returns it.
func (sh *shell) status() string {
	sh.t.Helper()
	sh.typeIn("echo \"rc=$?.\"\n")
	deadline := time.Now().Add(30 * time.Second)
	for {
		out := sh.out.String()
		if m := rcLine.FindStringSubmatchIndex(out[sh.seen:]); m != nil {
			code := out[sh.seen+m[2] : sh.seen+m[3]]
			sh.seen += m[1]
			return code
		}
		if time.Now().After(deadline) {
			sh.t.Fatalf("no exit status shown within 30s; after the last expectation the terminal shows:\n%s", out[sh.seen:])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

var rcLine = regexp.MustCompile(`rc=([0-9]+)\.`)

// script writes an sh script for exec to run and returns its path.
func script(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "child.sh")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestExecTerminal runs exec from an interactive shell on a
// pseudo-terminal: the command reads the terminal, Ctrl-Z stops the job
// and fg continues it, and Ctrl-C reaches the command as SIGINT (it may
// trap it) with exit 130 when it dies of it. The permit is released each
// time.
func TestExecTerminal(t *testing.T) {
	nats := natsBroker()
	name := uniqueName(t)
	nats.mustInit(t, name, 1)
	sh := startShell(t, nats.env())
	reader := script(t, `echo "ready to read"; read x; echo "got:$x"`+"\n")
	execLine := "seminit exec --name " + name + " -- "

	// The command owns the terminal: it reads the line typed.
	sh.typeIn(execLine + reader + "\n")
	sh.expect("ready to read")
	sh.typeIn("hello\n")
	sh.expect("got:hello")
	if rc := sh.status(); rc != "0" {
		t.Fatalf("exec of a command that read the terminal exited %s, want 0", rc)
	}

	// Job control: Ctrl-Z stops the job (the shell says so), fg
	// continues it where it was.
	sh.typeIn(execLine + reader + "\n")
	sh.expect("ready to read")
	sh.typeIn("\x1a")
	sh.expect("Stopped")
	sh.expect("$ ")
	if _, st := nats.statusJSON(t, name); st.Held != 1 {
		t.Errorf("status while the job is stopped = %+v, want the permit held", st)
	}
	sh.typeIn("fg\n")
	sh.typeIn("world\n")
	sh.expect("got:world")
	if rc := sh.status(); rc != "0" {
		t.Fatalf("exec stopped and continued exited %s, want 0", rc)
	}

	// Started in the background, the command stops when it reads the
	// terminal (and the job with it); fg gives it the terminal.
	sh.typeIn("set -b\n") // report job changes at once
	sh.expect("$ ")
	sh.typeIn(execLine + reader + " &\n")
	sh.expect("ready to read")
	sh.expect("Stopped")
	sh.typeIn("fg\n")
	sh.typeIn("later\n")
	sh.expect("got:later")
	if rc := sh.status(); rc != "0" {
		t.Fatalf("exec started in the background, then fg: exited %s, want 0", rc)
	}

	// Ctrl-C reaches the command as SIGINT; it traps it, then dies of it.
	trapper := script(t, `trap 'echo "saw SIGINT"; trap - INT; kill -INT $$' INT
echo "ready for Ctrl-C"
while :; do sleep 0.1; done
`)
	sh.typeIn(execLine + trapper + "\n")
	sh.expect("ready for Ctrl-C")
	sh.typeIn("\x03")
	sh.expect("saw SIGINT")
	if rc := sh.status(); rc != "130" {
		t.Fatalf("exec after Ctrl-C exited %s, want 130 (128+SIGINT)", rc)
	}
	if r := nats.seminit(t, "exec", "--name", name, "--wait", "5s", "--", "true"); r.code != exitOK {
		t.Fatalf("exec after the terminal's jobs: %v\nthe permit did not come back", r)
	}
}

// TestExecForwardsSignals: each stop signal sent to seminit exec (by kill,
// not the terminal) reaches its command as itself, and seminit exits with
// the command's status.
func TestExecForwardsSignals(t *testing.T) {
	nats := natsBroker()
	name := uniqueName(t)
	nats.mustInit(t, name, 1)
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT} {
		short := strings.TrimPrefix(unix.SignalName(sig), "SIG")
		t.Run(short, func(t *testing.T) {
			child := script(t, fmt.Sprintf("trap 'echo \"saw %[1]s\"; exit 3' %[1]s\necho ready\nwhile :; do sleep 0.1; done\n", short))
			p := startSeminit(t, nats.env(), "exec", "--name", name, "--", child)
			if line := p.waitLine(20 * time.Second); line != "ready" {
				t.Fatalf("command printed %q, want ready", line)
			}
			if err := p.cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			r := p.wait(10 * time.Second)
			if r.code != 3 || !strings.Contains(r.stdout, "saw "+short) {
				t.Fatalf("seminit exec after %v: %v\nwant the command to see %s and exit 3", sig, r, short)
			}
		})
	}
}

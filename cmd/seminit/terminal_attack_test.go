//go:build linux

package main

// Attacks on exec's terminal handoff (child_linux.go) from an interactive
// bash on a pseudo-terminal (startShell), as a user at a terminal meets
// them: jobs started in the background, Ctrl-Z with bg and fg, stops while
// waiting for the permit, pipelines, commands that open /dev/tty, nested
// execs and a permit lost while the command has the terminal. After each
// case the shell must read and run the next command line with the
// terminal's modes as they were (sane).
//
// The tests named TestAttackBug* showed bugs of the first handoff (a
// helper's attack, each failing 5 of 5 before the fix).

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// await waits at most d until the terminal shows one of wants after what
// earlier expectations consumed; it consumes up to the end of the first
// one shown and returns its index, or -1 (consuming nothing) when none
// showed within d.
func (sh *shell) await(d time.Duration, wants ...string) int {
	sh.t.Helper()
	deadline := time.Now().Add(d)
	for {
		out := sh.out.String()[sh.seen:]
		best, at := -1, len(out)
		for i, w := range wants {
			if j := strings.Index(out, w); j >= 0 && j < at {
				best, at = i, j
			}
		}
		if best >= 0 {
			sh.seen += at + len(wants[best])
			return best
		}
		if time.Now().After(deadline) {
			return -1
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// must is await of one string that fails the test after d.
func (sh *shell) must(d time.Duration, want, what string) {
	sh.t.Helper()
	if sh.await(d, want) < 0 {
		sh.t.Fatalf("%s: the terminal did not show %q within %v; after the last expectation it shows:\n%s",
			what, want, d, sh.out.String()[sh.seen:])
	}
}

var (
	sttyLine = regexp.MustCompile(`stty=([0-9a-f:]+)\.`)
	pidLine  = regexp.MustCompile(`pid=([0-9]+)\.`)
	jobLine  = regexp.MustCompile(`\[1\] ([0-9]+)`) // the shell's line for a job started with &: its last process's pid
)

// match waits for re on the terminal and returns its first group.
func (sh *shell) match(re *regexp.Regexp, what string) string {
	sh.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		out := sh.out.String()
		if m := re.FindStringSubmatchIndex(out[sh.seen:]); m != nil {
			v := out[sh.seen+m[2] : sh.seen+m[3]]
			sh.seen += m[1]
			return v
		}
		if time.Now().After(deadline) {
			sh.t.Fatalf("%s: no %v within 30s; after the last expectation the terminal shows:\n%s", what, re, out[sh.seen:])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// modes returns the terminal's modes as the shell's next command sees
// them (stty -g): the shell read and ran the line.
func (sh *shell) modes() string {
	sh.t.Helper()
	sh.typeIn("echo \"stty=$(stty -g).\"\n")
	return sh.match(sttyLine, "stty -g")
}

// attackShell is startShell with a check, at the end of the test, that
// the shell still reads command lines and the terminal's modes are those
// it started with.
func attackShell(t *testing.T, env []string) *shell {
	t.Helper()
	sh := startShell(t, env)
	before := sh.modes()
	t.Cleanup(func() {
		if t.Failed() || t.Skipped() {
			return
		}
		// A unique reply proves the shell ran this line, not that the
		// terminal echoed it.
		sh.typeIn("echo \"sane-$((40+2))\"\n")
		sh.must(15*time.Second, "sane-42", "the shell after the test")
		if after := sh.modes(); after != before {
			t.Errorf("terminal modes after the test %s, before %s", after, before)
		}
	})
	return sh
}

// procState is the state letter of process pid in /proc (R, S, T, Z...),
// or 0 if it is gone.
func procState(pid int) byte {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 || i+2 >= len(stat) {
		return 0
	}
	return stat[i+2]
}

// hasTerminal reports whether process pid runs (is not stopped) in its
// terminal's foreground process group.
func hasTerminal(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return false
	}
	// After the name: state ppid pgrp session tty_nr tpgid ...
	f := strings.Fields(string(stat[i+1:]))
	return len(f) > 5 && f[0] != "T" && f[2] == f[5]
}

// jobStopped waits until the shell lists its job (the only one) stopped,
// then for its prompt: a fg typed now continues the job. A fg the shell
// runs while it still lists the job running (it stops itself, the stop not
// yet taken hold) gives the job the terminal without a SIGCONT and takes
// the terminal back when the stop reaches it: the shell shows the job
// stopped, and the next line typed goes to the shell. A plain job stopping
// on a read has the same moment, only shorter; seminit's is longer (it
// sees its command stop, then stops its own job; see suspend).
func (sh *shell) jobStopped(what string) {
	sh.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		sh.typeIn("jobs\n")
		switch sh.await(10*time.Second, "Stopped", "Running") {
		case 0:
			sh.expect("$ ")
			return
		case 1:
			if time.Now().After(deadline) {
				sh.t.Fatalf("%s: the shell still lists the job running after 20s; terminal:\n%s", what, sh.out.String()[sh.seen:])
			}
			time.Sleep(100 * time.Millisecond)
		default:
			sh.t.Fatalf("%s: jobs printed neither Stopped nor Running; terminal:\n%s", what, sh.out.String()[sh.seen:])
		}
	}
}

// readerScript prints its pid and "ready to read", reads a line from its
// standard input and prints it back.
func readerScript(t *testing.T) string {
	return script(t, `echo "pid=$$."; echo "ready to read"; read x; echo "got:$x"`+"\n")
}

// TestAttackCtrlZTwice: Ctrl-Z, fg, Ctrl-Z, fg; the command then reads
// the terminal, and exec exits 0.
func TestAttackCtrlZTwice(t *testing.T) {
	nats := natsBroker()
	name := uniqueName(t)
	nats.mustInit(t, name, 1)
	sh := attackShell(t, nats.env())
	sh.typeIn("seminit exec --name " + name + " -- " + readerScript(t) + "\n")
	pid, _ := strconv.Atoi(sh.match(pidLine, "the command's pid"))
	sh.expect("ready to read")
	for round := range 2 {
		sh.typeIn("\x1a")
		sh.expect("Stopped")
		sh.expect("$ ")
		sh.typeIn("fg\n")
		sh.expect(name) // fg prints the job's command line
		// The shell prints it before it hands the terminal on: a Ctrl-Z
		// typed before the command has the terminal again goes to the
		// shell, which ignores it, as it would without seminit.
		eventually(t, 15*time.Second, fmt.Sprintf("round %d: the command running in the terminal's foreground after fg", round+1),
			func() bool { return hasTerminal(pid) })
	}
	sh.typeIn("twice\n")
	sh.must(10*time.Second, "got:twice", "the command after two Ctrl-Z and fg")
	if rc := sh.status(); rc != "0" {
		t.Fatalf("exec exited %s, want 0", rc)
	}
}

// TestAttackStopWhileWaiting: Ctrl-Z while exec waits for the permit stops
// it; fg continues the wait, and the command, started once the permit
// comes, has the terminal.
func TestAttackStopWhileWaiting(t *testing.T) {
	nats := natsBroker()
	name := uniqueName(t)
	nats.mustInit(t, name, 1)
	holder, _ := nats.holder(t, name, 60)
	sh := attackShell(t, nats.env())
	sh.typeIn("seminit exec --name " + name + " -- " + readerScript(t) + "\n")
	sh.expect("waiting")
	sh.typeIn("\x1a")
	sh.expect("Stopped")
	sh.expect("$ ")
	_ = holder.cmd.Process.Signal(syscall.SIGTERM) // passed on: the holder ends, the permit is free
	holder.wait(15 * time.Second)
	sh.typeIn("fg\n")
	sh.expect("ready to read")
	sh.typeIn("late\n")
	sh.must(10*time.Second, "got:late", "the command started after Ctrl-Z and fg while waiting")
	if rc := sh.status(); rc != "0" {
		t.Fatalf("exec exited %s, want 0", rc)
	}
}

// TestAttackInterruptWhileWaiting: Ctrl-C while exec waits for the permit
// ends it with 130, and the command never runs.
func TestAttackInterruptWhileWaiting(t *testing.T) {
	nats := natsBroker()
	name := uniqueName(t)
	nats.mustInit(t, name, 1)
	nats.holder(t, name, 60)
	sh := attackShell(t, nats.env())
	ran := filepath.Join(t.TempDir(), "ran")
	sh.typeIn("seminit exec --name " + name + " -- touch " + ran + "\n")
	sh.expect("waiting")
	sh.typeIn("\x03")
	sh.expect("interrupted while waiting for a permit")
	if rc := sh.status(); rc != "130" {
		t.Fatalf("exec after Ctrl-C while waiting exited %s, want 130", rc)
	}
	if _, err := os.Stat(ran); err == nil {
		t.Fatal("the command ran although exec was interrupted before it had a permit")
	}
}

// TestAttackPipelines: exec in a pipeline. Its command reads the terminal
// while its output goes down a pipe, and reads /dev/tty while its input
// comes from one (seminit hands over the terminal it finds on any of the
// three streams).
func TestAttackPipelines(t *testing.T) {
	nats := natsBroker()
	name := uniqueName(t)
	nats.mustInit(t, name, 1)
	sh := attackShell(t, nats.env())
	execLine := "seminit exec --name " + name + " -- "

	// cat reads the terminal, head takes one line; Ctrl-D ends cat.
	sh.typeIn(execLine + "cat | head -1\n")
	sh.typeIn("first-line\n")
	sh.expect("first-line") // the terminal's echo
	sh.expect("first-line") // head
	sh.typeIn("\x04")
	sh.typeIn("echo \"rc=${PIPESTATUS[*]}.\"\n")
	sh.must(15*time.Second, "rc=0 0.", "exit statuses of exec -- cat | head -1")

	// Input from a pipe: the command reads it, then /dev/tty.
	ttyReader := script(t, `cat; echo "ready for tty"; read x </dev/tty; echo "tty:$x"`+"\n")
	sh.typeIn("echo piped-in | " + execLine + ttyReader + "\n")
	sh.expect("piped-in")
	sh.expect("ready for tty")
	sh.typeIn("typed\n")
	sh.must(10*time.Second, "tty:typed", "a command reading /dev/tty, its stdin a pipe")
	sh.typeIn("echo \"rc=${PIPESTATUS[*]}.\"\n")
	sh.must(15*time.Second, "rc=0 0.", "exit statuses of echo | exec")
}

// TestAttackNested: exec running exec: the inner command gets the
// terminal from the outer one, Ctrl-Z stops all of them and fg continues
// them with the terminal where it was.
func TestAttackNested(t *testing.T) {
	nats := natsBroker()
	a, b := uniqueName(t), uniqueName(t)
	nats.mustInit(t, a, 1)
	nats.mustInit(t, b, 1)
	sh := attackShell(t, nats.env())
	line := "seminit exec --name " + a + " -- seminit exec --name " + b + " -- " + readerScript(t) + "\n"

	sh.typeIn(line)
	sh.expect("ready to read")
	sh.typeIn("inner\n")
	sh.must(10*time.Second, "got:inner", "the nested command reading the terminal")
	if rc := sh.status(); rc != "0" {
		t.Fatalf("nested exec exited %s, want 0", rc)
	}

	sh.typeIn(line)
	pid, _ := strconv.Atoi(sh.match(pidLine, "the nested command's pid"))
	sh.expect("ready to read")
	sh.typeIn("\x1a")
	sh.expect("Stopped")
	sh.expect("$ ")
	if st := procState(pid); st != 'T' {
		t.Errorf("the nested command is in state %q after Ctrl-Z, want T (stopped)", st)
	}
	sh.typeIn("fg\n")
	sh.expect(a)
	sh.typeIn("again\n")
	sh.must(10*time.Second, "got:again", "the nested command after Ctrl-Z and fg")
	if rc := sh.status(); rc != "0" {
		t.Fatalf("nested exec after Ctrl-Z and fg exited %s, want 0", rc)
	}
	// Ctrl-C reaches the innermost command; each exec exits with 130.
	sh.typeIn(line)
	sh.expect("ready to read")
	sh.typeIn("\x03")
	sh.expect("$ ") // Ctrl-C flushes what is typed before the shell reads again
	if rc := sh.status(); rc != "130" {
		t.Fatalf("nested exec after Ctrl-C exited %s, want 130", rc)
	}
}

// TestAttackPermitLostInForeground: the command has the terminal when
// seminit is stopped from outside (SIGSTOP) past its lease and the permit
// goes to another holder. Continued, seminit stops the command and exits
// 70, and the shell has the terminal again.
func TestAttackPermitLostInForeground(t *testing.T) {
	nats := natsBroker()
	name := uniqueName(t)
	nats.mustInit(t, name, 1, "--lease", "2s")
	sh := attackShell(t, nats.env())
	// The job ends while the shell sits at its prompt: report it at once,
	// not before a next prompt that may come before the end.
	sh.typeIn("set -b\n")
	sh.expect("$ ")
	reader := script(t, `echo "pid=$PPID."; echo "child=$$"; echo "ready to read"; read x; echo "got:$x"`+"\n")
	sh.typeIn("seminit exec --name " + name + " -- " + reader + "\n")
	seminit, _ := strconv.Atoi(sh.match(pidLine, "seminit's pid"))
	child, _ := strconv.Atoi(sh.match(regexp.MustCompile(`child=([0-9]+)`), "the command's pid"))
	sh.expect("ready to read")
	if err := syscall.Kill(seminit, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// Once another exec gets the permit, the lease has run out.
	if r := nats.seminit(t, "exec", "--name", name, "--wait", "30s", "--", "true"); r.code != exitOK {
		_ = syscall.Kill(seminit, syscall.SIGCONT)
		t.Fatalf("exec while the holder is stopped: %v\nwant the permit once the lease ran out", r)
	}
	if err := syscall.Kill(seminit, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	sh.must(20*time.Second, "command stopped", "seminit continued after its permit was lost")
	// The shell took the terminal when the job stopped; it reports the
	// job's end at once (set -b), then runs the next line.
	sh.must(15*time.Second, "Exit 70", "the shell's report of the job")
	sh.typeIn("echo \"ok-$((1+1))\"\n")
	sh.must(15*time.Second, "ok-2", "the shell after the lost permit")
	eventually(t, 15*time.Second, "the command ends", func() bool { st := procState(child); return st == 0 || st == 'Z' })
}

// TestAttackBugBackgroundThenFg: a job started in the background (&)
// whose command reads the terminal stops, as it would without seminit; fg
// must then let it read. It did not: the command, in a process group of
// its own that the shell does not know, stayed stopped after fg and exec
// hung, holding the permit, until Ctrl-C (flock and a plain `CMD &` read
// the line).
//
// The fg is typed once seminit has stopped too and the shell lists the job
// stopped, as a user would see it. One typed in the moment between the command's stop
// and seminit's (which the kernel cannot make one step: seminit sees the
// command stop, then stops its own job) can find seminit stopping in the
// foreground; the shell then shows the job stopped, and a second fg goes
// on (see suspend).
func TestAttackBugBackgroundThenFg(t *testing.T) {
	nats := natsBroker()
	name := uniqueName(t)
	nats.mustInit(t, name, 1)
	sh := attackShell(t, nats.env())
	reader := readerScript(t)

	// The shell's own way, the control: the job stops on its read, fg
	// lets it read.
	sh.typeIn(reader + " &\n")
	sh.expect("ready to read")
	sh.typeIn("fg\n")
	sh.typeIn("plain\n")
	sh.must(10*time.Second, "got:plain", "the plain job after fg")

	sh.typeIn("seminit exec --name " + name + " -- " + reader + " &\n")
	seminit, _ := strconv.Atoi(sh.match(jobLine, "seminit's pid"))
	pid, _ := strconv.Atoi(sh.match(pidLine, "the command's pid"))
	sh.expect("ready to read")
	eventually(t, 15*time.Second, "the command stops on reading the terminal from the background",
		func() bool { return procState(pid) == 'T' })
	eventually(t, 15*time.Second, "seminit's job stops with it",
		func() bool { return procState(seminit) == 'T' })
	// And the shell has seen the job stop.
	sh.jobStopped("the job started in the background")
	sh.typeIn("fg\n")
	sh.typeIn("hello\n")
	if sh.await(10*time.Second, "got:hello") < 0 {
		st := procState(pid)
		sh.typeIn("\x03") // the shell's cleanup then runs
		t.Fatalf("after fg the command (state %q) did not read the line typed within 10s; terminal:\n%s",
			st, sh.out.String()[sh.seen:])
	}
	if rc := sh.status(); rc != "0" {
		t.Fatalf("exec started in the background, then fg, exited %s, want 0", rc)
	}
}

// TestAttackBugCtrlZBg: Ctrl-Z then bg must leave the terminal with the
// shell: the next command line goes to the shell, not to the command now
// in the background. Today seminit's suspend races its own SIGTSTP (kill
// returns before the stop takes effect): it sees itself still in the
// foreground and hands the terminal to the command, then stops; after bg
// the command reads the shell's next line, and when it ends bash gets EIO
// and exits. Three rounds make the race show.
func TestAttackBugCtrlZBg(t *testing.T) {
	nats := natsBroker()
	name := uniqueName(t)
	nats.mustInit(t, name, 1)
	sh := attackShell(t, nats.env())
	reader := readerScript(t)
	for i := range 3 {
		sh.typeIn("seminit exec --name " + name + " -- " + reader + "\n")
		pid, _ := strconv.Atoi(sh.match(pidLine, "the command's pid"))
		sh.expect("ready to read")
		sh.typeIn("\x1a")
		sh.expect("Stopped")
		sh.expect("$ ")
		sh.typeIn("bg\n")
		sh.expect("&")
		sh.typeIn(fmt.Sprintf("echo \"shell-$((%d+1000))\"\n", i))
		switch sh.await(20*time.Second, fmt.Sprintf("shell-%d", i+1000), "got:") {
		case 1:
			t.Fatalf("round %d: after Ctrl-Z and bg the command read the shell's command line; terminal:\n%s", i, sh.out.String())
		case -1:
			t.Fatalf("round %d: after Ctrl-Z and bg the shell did not run the next line; terminal:\n%s", i, sh.out.String()[sh.seen:])
		}
		// The backgrounded command stops on its read, and seminit's job
		// with it; fg lets it read. The fg is typed once the shell lists
		// the job stopped (jobStopped): a loaded CI ran one while seminit
		// was stopping itself, the shell showed the job stopped again
		// and took the line typed next. The line is typed once the
		// command has the terminal.
		sh.jobStopped(fmt.Sprintf("round %d: the command reading in the background", i))
		sh.typeIn("fg\n")
		eventually(t, 15*time.Second, fmt.Sprintf("round %d: the command running in the terminal's foreground after fg", i),
			func() bool { return hasTerminal(pid) })
		sh.typeIn("round\n")
		sh.must(10*time.Second, "got:round", "the command after bg and fg")
		if rc := sh.status(); rc != "0" {
			t.Fatalf("round %d: exec after Ctrl-Z, bg, fg exited %s, want 0", i, rc)
		}
	}
}

// TestAttackBugTTYWithoutStreams: a command whose standard streams are all
// redirected but that opens /dev/tty (ssh or sudo asking a password, less,
// git's credential prompt) must be able to read it, as under flock. Today
// seminit hands over the terminal only when one of the three streams is
// it: the command, in a background process group, stops on SIGTTIN and
// exec hangs holding the permit.
func TestAttackBugTTYWithoutStreams(t *testing.T) {
	nats := natsBroker()
	name := uniqueName(t)
	nats.mustInit(t, name, 1)
	sh := attackShell(t, nats.env())
	ttyReader := script(t, `echo "ready on tty" >/dev/tty; read x </dev/tty; echo "tty:$x" >/dev/tty`+"\n")
	sh.typeIn("seminit exec --name " + name + " -- " + ttyReader + " </dev/null >/dev/null 2>&1\n")
	sh.expect("ready on tty")
	sh.typeIn("secret\n")
	if sh.await(10*time.Second, "tty:secret") < 0 {
		sh.typeIn("\x03")
		t.Fatalf("the command did not read /dev/tty within 10s; terminal:\n%s", sh.out.String()[sh.seen:])
	}
	if rc := sh.status(); rc != "0" {
		t.Fatalf("exec exited %s, want 0", rc)
	}
}

// TestAttackBugPipelineSibling: in `seminit exec -- PRODUCER | CONSUMER`,
// a consumer that reads the terminal (less, a pager, a prompt) must be able
// to, as it can without seminit. Today seminit puts PRODUCER in the
// foreground, the consumer, left in seminit's background group, reads the
// terminal and the kernel stops that whole group (SIGTTIN): the shell shows
// the job Stopped.
func TestAttackBugPipelineSibling(t *testing.T) {
	nats := natsBroker()
	name := uniqueName(t)
	nats.mustInit(t, name, 1)
	sh := attackShell(t, nats.env())
	done := filepath.Join(t.TempDir(), "done")
	t.Cleanup(func() { _ = os.WriteFile(done, nil, 0o644) })
	producer := script(t, fmt.Sprintf("echo produced; while [ ! -e %s ]; do sleep 0.05; done\n", done))
	consumer := script(t, fmt.Sprintf(`read l; echo "piped:$l"; read x </dev/tty; echo "tty:$x"; touch %s`+"\n", done))
	sh.typeIn("seminit exec --name " + name + " -- " + producer + " | " + consumer + "\n")
	sh.expect("piped:produced")
	sh.typeIn("typed\n")
	switch sh.await(15*time.Second, "tty:typed", "Stopped") {
	case 1:
		t.Fatalf("the pipeline was stopped when its last command read the terminal; terminal:\n%s", sh.out.String())
	case -1:
		t.Fatalf("the pipeline's last command did not read the terminal within 15s; terminal:\n%s", sh.out.String()[sh.seen:])
	}
	sh.typeIn("echo \"rc=${PIPESTATUS[*]}.\"\n")
	sh.must(15*time.Second, "rc=0 0.", "exit statuses of the pipeline")
}

// hangup hangs up the shell's terminal as closing its window does (the
// master's close: the kernel's tty hangup, SIGHUP to the session leader
// and the foreground group). The master is not closed: the shell's cleanup
// does that.
func hangup(t *testing.T, sh *shell) {
	t.Helper()
	rc, err := sh.pty.SyscallConn() // not Fd, which would make the master blocking
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if cerr := rc.Control(func(fd uintptr) { n, err = unix.IoctlGetInt(int(fd), unix.TIOCGPTN) }); cerr != nil || err != nil {
		t.Fatalf("pty number: %v %v", cerr, err)
	}
	slave, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open pty: %v", err)
	}
	defer slave.Close()
	if err := unix.IoctlSetInt(int(slave.Fd()), unix.TIOCVHANGUP, 0); err != nil {
		t.Skipf("cannot hang up the terminal here (TIOCVHANGUP needs CAP_SYS_ADMIN): %v", err)
	}
}

// TestAttackHangup: the terminal goes away (its window closed) while the
// command reads it, or while the job is stopped (Ctrl-Z): the command
// ends and the permit is released.
func TestAttackHangup(t *testing.T) {
	for _, stopped := range []bool{false, true} {
		t.Run(map[bool]string{false: "running", true: "stopped"}[stopped], func(t *testing.T) {
			nats := natsBroker()
			name := uniqueName(t)
			nats.mustInit(t, name, 1)
			sh := startShell(t, nats.env())
			sh.typeIn("seminit exec --name " + name + " -- " + readerScript(t) + "\n")
			pid, _ := strconv.Atoi(sh.match(pidLine, "the command's pid"))
			sh.expect("ready to read")
			if stopped {
				sh.typeIn("\x1a")
				sh.expect("Stopped")
				sh.expect("$ ")
			}
			hangup(t, sh)
			eventually(t, 20*time.Second, "the command ends after the terminal's hangup",
				func() bool { st := procState(pid); return st == 0 || st == 'Z' })
			if r := nats.seminit(t, "exec", "--name", name, "--wait", "20s", "--", "true"); r.code != exitOK {
				t.Fatalf("exec after the terminal's hangup: %v\nwant the permit released", r)
			}
		})
	}
}

// TestAttackPermitLostWhileStopped: the job stays stopped (Ctrl-Z) past
// the lease and the permit goes to another holder; fg continues seminit,
// which stops the command and exits 70, leaving the shell the terminal.
func TestAttackPermitLostWhileStopped(t *testing.T) {
	nats := natsBroker()
	name := uniqueName(t)
	nats.mustInit(t, name, 1, "--lease", "2s")
	sh := attackShell(t, nats.env())
	sh.typeIn("seminit exec --name " + name + " -- " + readerScript(t) + "\n")
	pid, _ := strconv.Atoi(sh.match(pidLine, "the command's pid"))
	sh.expect("ready to read")
	sh.typeIn("\x1a")
	sh.expect("Stopped")
	sh.expect("$ ")
	if r := nats.seminit(t, "exec", "--name", name, "--wait", "30s", "--", "true"); r.code != exitOK {
		t.Fatalf("exec while the holder is stopped: %v\nwant the permit once the lease ran out", r)
	}
	sh.typeIn("fg\n")
	sh.must(20*time.Second, "command stopped", "seminit continued after its permit was lost")
	if rc := sh.status(); rc != "70" {
		t.Fatalf("exec that lost its permit while stopped exited %s, want 70", rc)
	}
	eventually(t, 15*time.Second, "the command ends", func() bool { st := procState(pid); return st == 0 || st == 'Z' })
}

// TestAttackBugCtrlCEndsScript: Ctrl-C while a script's `seminit exec`
// has the terminal must end the script, as it does with the command run
// without seminit, under flock or timeout --foreground: the terminal
// signals the whole foreground job. Today only the command's own process
// group is in the foreground, so the script never gets SIGINT; seminit
// exits 130 (a normal exit, not death by SIGINT) and a loop of execs goes
// on with its next round: one Ctrl-C per round.
func TestAttackBugCtrlCEndsScript(t *testing.T) {
	nats := natsBroker()
	name := uniqueName(t)
	nats.mustInit(t, name, 1)
	sh := attackShell(t, nats.env())
	reader := readerScript(t)
	loop := func(cmd string) string {
		return `bash -c 'for i in 1 2 3; do ` + cmd + `; echo "after-$i"; done; echo loop-end'` + "\n"
	}

	// The control: without seminit, one Ctrl-C ends the loop.
	sh.typeIn(loop(reader))
	sh.expect("ready to read")
	sh.typeIn("\x03")
	sh.expect("$ ")
	if rc := sh.status(); rc != "130" {
		t.Fatalf("the loop without seminit exited %s after Ctrl-C, want 130", rc)
	}

	sh.typeIn(loop("seminit exec --name " + name + " -- " + reader))
	sh.expect("ready to read")
	sh.typeIn("\x03")
	switch sh.await(15*time.Second, "after-1", "$ ") {
	case 0:
		t.Fatalf("after Ctrl-C the script went on; terminal:\n%s", sh.out.String())
	case -1:
		t.Fatalf("the script did not end within 15s of Ctrl-C; terminal:\n%s", sh.out.String()[sh.seen:])
	}
	if rc := sh.status(); rc != "130" {
		t.Fatalf("the loop of seminit exec exited %s after Ctrl-C, want 130", rc)
	}
}

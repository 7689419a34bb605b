package main

// Black-box tests of the seminit command. TestMain builds the binary once
// and runs it as `seminit server` on a free loopback port, and finds a
// RabbitMQ the way the library tests do (rabbittest.Start: $RABBITMQ_URL).
// Every test then drives real seminit processes against those brokers; the
// contract tests run once per backend
// (see forEachBroker). The test binary also doubles as a child command for
// `seminit exec` (see meterChild).

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tokensem/tokensem/internal/freeport"
	"github.com/tokensem/tokensem/internal/rabbittest"
	"github.com/tokensem/tokensem/internal/redact"
	"github.com/tokensem/tokensem/internal/semtest"
	"github.com/tokensem/tokensem/internal/testenv"
)

// meterChildEnv, when set to a host:port, turns the test binary into the
// child command of the contention test instead of running tests.
const meterChildEnv = "SEMINIT_TEST_METER_CHILD"

// meterHoldEnv, a duration, is how long a meter child stays inside
// (default 30ms).
const meterHoldEnv = "SEMINIT_TEST_METER_HOLD"

var (
	seminitBin string              // the built seminit binary
	serverURL  string              // nats://127.0.0.1:port of the seminit server
	serverOut  *semtest.SyncBuffer // the server's stdout
	serverCmd  *exec.Cmd           // the running `seminit server`
	rabbitURL  string              // amqp:// URL of the RabbitMQ under test; "" when none
	rabbitErr  error               // why there is no RabbitMQ
)

func TestMain(m *testing.M) {
	if addr := os.Getenv(meterChildEnv); addr != "" {
		os.Exit(meterChild(addr))
	}
	if addr := os.Getenv(setMeterChildEnv); addr != "" {
		os.Exit(setMeterChild(addr))
	}
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "seminit-test-*")
	if err != nil {
		fmt.Fprintln(os.Stderr, "temp dir:", err)
		return 1
	}
	defer os.RemoveAll(dir)

	seminitBin = filepath.Join(dir, "seminit")
	build := exec.Command("go", "build", "-o", seminitBin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		return 1
	}

	// No RabbitMQ is not fatal here: the NATS tests run regardless, and
	// the amqp variants skip (fail under CI=true: rabbittest.Missing).
	if b, err := rabbittest.Start(context.Background()); err != nil {
		rabbitErr = err
		fmt.Fprintln(os.Stderr, "seminit tests: amqp variants will not run:", err)
	} else {
		defer b.Stop()
		rabbitURL = b.URL
	}

	stop, err := startServer(filepath.Join(dir, "store"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "seminit server:", err)
		return 1
	}
	testenv.WaitBound()
	code := m.Run()
	for _, url := range append([]string{rabbitURL}, strings.Split(os.Getenv(rabbittest.ClusterEnv), ";")...) {
		if url == "" {
			continue
		}
		// Every name uniqueName makes carries runID.
		if left := testenv.Sweep(url, "t"+runID+"-"); len(left) > 0 {
			fmt.Fprintf(os.Stderr, "seminit tests: could not delete %d semaphores they made on %s: %v\n", len(left), redact.URL(url), left)
		}
	}
	if err := stop(); err != nil {
		fmt.Fprintln(os.Stderr, "seminit server:", err)
		code = 1
	}
	if code == 0 {
		if err := goleak.Find(testenv.ServerLeaks...); err != nil {
			fmt.Fprintln(os.Stderr, "leaked goroutines:", err)
			code = 1
		}
	}
	return code
}

// startServer runs `seminit server` on a free port and waits until it has
// announced itself and accepts TCP connections. stop sends SIGTERM and
// waits for a clean exit.
func startServer(store string) (stop func() error, err error) {
	addr, err := freeport.Addr()
	if err != nil {
		return nil, err
	}
	serverOut = &semtest.SyncBuffer{}
	var stderr semtest.SyncBuffer
	serverCmd = exec.Command(seminitBin, "server", "--listen", addr, "--store", store)
	serverCmd.Stdout, serverCmd.Stderr = serverOut, &stderr
	if err := serverCmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- serverCmd.Wait() }()
	stop = func() error {
		_ = serverCmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-done:
			if err != nil {
				return fmt.Errorf("exit after SIGTERM: %v (stderr %q)", err, stderr.String())
			}
		case <-time.After(15 * time.Second):
			_ = serverCmd.Process.Kill()
			<-done
			return errors.New("did not stop within 15s of SIGTERM")
		}
		if !strings.Contains(serverOut.String(), "shutting down") {
			return fmt.Errorf("no shutdown line in output %q", serverOut.String())
		}
		return nil
	}

	serverURL = "nats://" + addr
	want := "listening on " + serverURL
	deadline := time.Now().Add(20 * time.Second)
	for {
		out := serverOut.String()
		if strings.Contains(out, want) {
			if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
				_ = c.Close()
				return stop, nil
			}
		}
		select {
		case err := <-done:
			return nil, fmt.Errorf("exited early: %v; stdout %q, stderr %q", err, out, stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = serverCmd.Process.Kill()
			<-done
			return nil, fmt.Errorf("no %q and a TCP listener within 20s; stdout %q, stderr %q", want, out, stderr.String())
		}
	}
}

// meterChild is the test binary acting as `seminit exec`'s child: it
// reports entering and leaving its critical section to the meter at addr,
// with the slot and fence seminit gave it, and holds for a little while.
func meterChild(addr string) int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "meter child:", err)
		return 3
	}
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return fail(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	r := bufio.NewReader(c)
	say := func(msg string) error {
		if _, err := fmt.Fprintf(c, "%s\n", msg); err != nil {
			return err
		}
		reply, err := r.ReadString('\n')
		if err != nil {
			return err
		}
		if reply != "ok\n" {
			return fmt.Errorf("meter replied %q to %q", reply, msg)
		}
		return nil
	}
	if err := say(fmt.Sprintf("enter %s %s", os.Getenv("TOKENSEM_SLOT"), os.Getenv("TOKENSEM_FENCE"))); err != nil {
		return fail(err)
	}
	hold := 30 * time.Millisecond
	if v := os.Getenv(meterHoldEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return fail(err)
		}
		hold = d
	}
	time.Sleep(hold)
	if err := say("leave"); err != nil {
		return fail(err)
	}
	return 0
}

// broker is a backend the contract tests run against.
type broker struct {
	name   string // "nats" or "amqp": the URL scheme and status's "backend"
	url    string // "" when there is no such broker
	prefix string // the token store's name is prefix+semaphore name
	leases bool   // init takes --lease
	group  string // NATS: semaphores are keys of this group ($TOKENSEM_GROUP)
}

// brokers are the backends: the `seminit server` and the RabbitMQ TestMain
// found (url "" when none).
func brokers() []broker {
	return []broker{
		{name: "nats", url: serverURL, prefix: "TOKENSEM_", leases: true},
		{name: "amqp", url: rabbitURL, prefix: "tokensem."},
	}
}

// natsBroker is the `seminit server`, for tests of NATS-only behaviour.
func natsBroker() broker { return brokers()[0] }

// amqpBroker is the RabbitMQ, for tests of amqp-only behaviour; see need.
func amqpBroker(t testing.TB) broker {
	t.Helper()
	b := brokers()[1]
	b.need(t)
	return b
}

// need skips the test when the broker does not exist, or fails it under
// CI=true (rabbittest.Missing; only RabbitMQ can be missing).
func (b broker) need(t testing.TB) {
	t.Helper()
	if b.url == "" {
		rabbittest.Missing(t, rabbitErr)
	}
}

// forEachBroker runs test as a subtest per backend, named after it.
func forEachBroker(t *testing.T, test func(t *testing.T, b broker)) {
	for _, b := range brokers() {
		t.Run(b.name, func(t *testing.T) {
			b.need(t)
			test(t, b)
		})
	}
}

// env is the environment of every seminit process: the test's own,
// without TOKENSEM_* settings, pointed at the broker.
func (b broker) env(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TOKENSEM_") && !strings.HasPrefix(kv, meterChildEnv+"=") &&
			!strings.HasPrefix(kv, setMeterChildEnv+"=") {
			env = append(env, kv)
		}
	}
	env = append(env, "TOKENSEM_URL="+b.url)
	if b.group != "" {
		env = append(env, "TOKENSEM_GROUP="+b.group)
	}
	return append(env, extra...)
}

// result is how a seminit process ended.
type result struct {
	code           int // exit code; -1 when a signal killed it
	stdout, stderr string
	elapsed        time.Duration
}

func (r result) String() string {
	return fmt.Sprintf("exit %d after %v\nstdout: %s\nstderr: %s", r.code, r.elapsed.Round(time.Millisecond), r.stdout, r.stderr)
}

// proc is a seminit process the test started; a cleanup kills it.
type proc struct {
	t              testing.TB
	cmd            *exec.Cmd
	start          time.Time
	stdout, stderr semtest.SyncBuffer
	done           chan struct{}
	res            result
}

// startSeminit starts seminit with args in the background. The cleanup
// sends SIGTERM (seminit passes it on to an exec child), then SIGKILL.
func startSeminit(t testing.TB, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, done: make(chan struct{})}
	p.cmd = exec.Command(seminitBin, args...)
	p.cmd.Env = env
	// A session of its own, without the terminal of a developer who runs
	// the tests from one (CI has none): exec would share that terminal
	// with its command (child_linux.go). terminal_test.go gives seminit a
	// terminal on purpose.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	// An orphaned exec child (after kill -9 of seminit) keeps the output
	// pipes open; do not wait for it.
	p.cmd.WaitDelay = time.Second
	p.start = time.Now()
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start seminit %v: %v", args, err)
	}
	go func() {
		defer close(p.done)
		err := p.cmd.Wait()
		p.res = result{code: p.cmd.ProcessState.ExitCode(), elapsed: time.Since(p.start),
			stdout: p.stdout.String(), stderr: p.stderr.String()}
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			p.res.stderr += "\n(wait: " + err.Error() + ")"
		}
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
			return
		default:
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// wait waits at most d for the process to exit.
func (p *proc) wait(d time.Duration) result {
	p.t.Helper()
	select {
	case <-p.done:
		return p.res
	case <-time.After(d):
		p.t.Fatalf("seminit %v still running after %v\nstdout: %s\nstderr: %s",
			p.cmd.Args[1:], d, p.stdout.String(), p.stderr.String())
		return result{}
	}
}

// exited reports whether the process has ended.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// waitLine polls stdout until it contains a full line, and returns the
// first one.
func (p *proc) waitLine(d time.Duration) string {
	p.t.Helper()
	deadline := time.Now().Add(d)
	for {
		if line, _, ok := strings.Cut(p.stdout.String(), "\n"); ok {
			return line
		}
		if p.exited() {
			p.t.Fatalf("seminit %v exited before printing a line: %v", p.cmd.Args[1:], p.res)
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("seminit %v printed no line within %v\nstderr: %s", p.cmd.Args[1:], d, p.stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// seminit runs seminit with args on the broker to completion (at most 60s).
func (b broker) seminit(t testing.TB, args ...string) result {
	t.Helper()
	return startSeminit(t, b.env(), args...).wait(60 * time.Second)
}

var (
	nameSeq atomic.Int64
	// runID tells this run's names from those of earlier runs: RabbitMQ
	// keeps its queues, and a pid can come round again (say, in a fresh
	// container).
	runID = fmt.Sprintf("%08x", rand.Uint32())
)

// uniqueName returns a fresh semaphore name for a test, unique across
// runs: t, the run id, a sequence number and the end of the test's name
// (51 bytes plus the sequence number's digits, within tokensem.MaxNameLen).
func uniqueName(t testing.TB) string {
	base := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, t.Name())
	if len(base) > 40 {
		base = base[len(base)-40:]
	}
	return fmt.Sprintf("t%s-%d-%s", runID, nameSeq.Add(1), strings.Trim(base, "-"))
}

// mustInit creates a semaphore on the broker with seminit init.
func (b broker) mustInit(t testing.TB, name string, permits int, extra ...string) {
	t.Helper()
	args := append([]string{"init", "--name", name, "--permits", fmt.Sprint(permits)}, extra...)
	if r := b.seminit(t, args...); r.code != exitOK {
		t.Fatalf("seminit %v: %v", args, r)
	}
}

// alive reports whether process pid exists and is not a zombie: an orphan
// (the child of a killed seminit exec) stays a zombie until init reaps it,
// which here can take a second or two.
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	// "pid (comm) state ...", where comm may itself hold ')'.
	i := bytes.LastIndexByte(stat, ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] != 'Z'
}

// eventually polls cond every 20ms until it holds or d passes.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not within %v", what, d)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

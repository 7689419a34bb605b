package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// unreachable is a broker URL nothing listens on.
const unreachable = "nats://127.0.0.1:1"

func TestServerAnnounces(t *testing.T) {
	out := serverOut.String()
	line, _, _ := strings.Cut(out, "\n")
	if !strings.HasPrefix(line, "seminit: NATS JetStream listening on "+serverURL+", store ") {
		t.Fatalf("server's first line = %q, want it to name %s and its store", line, serverURL)
	}
}

// TestUsage covers the cases that fail before any broker is contacted; it
// calls run directly. Broker verbs get an unreachable --url, so a check
// that slipped past validation would show up as exit 69, not 64.
func TestUsage(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		want       int
		wantStdout string
		wantStderr string
	}{
		{"no args", nil, exitUsage, "Usage:", ""},
		{"help", []string{"help"}, exitOK, "Usage:", ""},
		{"--help", []string{"--help"}, exitOK, "Exit codes:", ""},
		{"unknown verb", []string{"frobnicate"}, exitUsage, "", `unknown command "frobnicate"; seminit --help`},
		{"misspelt verb", []string{"exce"}, exitUsage, "", `unknown command "exce" (did you mean "exec"?)`},
		{"verb prefix", []string{"stat"}, exitUsage, "", `(did you mean "status"?)`},
		{"--version", []string{"--version"}, exitOK, "seminit ", ""},
		{"init no name", []string{"init", "--url", unreachable, "--permits", "1"}, exitUsage, "", "--name is required"},
		{"init bad name", []string{"init", "--url", unreachable, "--name", "a.b", "--permits", "1"}, exitUsage, "", "invalid semaphore name"},
		{"status bad name", []string{"status", "--url", unreachable, "--name", "a.b"}, exitUsage, "", "invalid semaphore name"},
		{"exec bad name", []string{"exec", "--url", unreachable, "--name", "a.b", "--", "true"}, exitUsage, "", "invalid semaphore name"},
		{"zero permits", []string{"init", "--url", unreachable, "--name", "x", "--permits", "0"}, exitUsage, "", "invalid permit count"},
		{"negative permits", []string{"init", "--url", unreachable, "--name", "x", "--permits", "-1"}, exitUsage, "", "invalid permit count"},
		{"missing permits", []string{"init", "--url", unreachable, "--name", "x"}, exitUsage, "", "--permits is required"},
		{"resize missing permits", []string{"resize", "--url", unreachable, "--name", "x"}, exitUsage, "", "--permits is required"},
		{"init extra arg", []string{"init", "--url", unreachable, "--name", "x", "--permits", "1", "extra"}, exitUsage, "", `unexpected argument "extra"`},
		{"unknown flag", []string{"status", "--url", unreachable, "--name", "x", "--bogus"}, exitUsage, "", "not defined: --bogus"},
		{"bad flag value", []string{"exec", "--url", unreachable, "--name", "x", "--wait", "soon", "--", "true"}, exitUsage, "", `for flag --wait`},
		{"exec no command", []string{"exec", "--url", unreachable, "--name", "x"}, exitUsage, "", "no command given"},
		{"exec no command after --", []string{"exec", "--url", unreachable, "--name", "x", "--"}, exitUsage, "", "no command given"},
		{"exec negative wait", []string{"exec", "--url", unreachable, "--name", "x", "--wait", "-1s", "--", "true"}, exitUsage, "", "must not be negative"},
		{"exec bad conflict code", []string{"exec", "--url", unreachable, "--name", "x", "--conflict-exit-code", "300", "--", "true"}, exitUsage, "", "not an exit code"},
		{"exec zero kill-after", []string{"exec", "--url", unreachable, "--name", "x", "--kill-after", "0s", "--", "true"}, exitUsage, "", "--kill-after must be positive"},
		{"amqp unreachable", []string{"init", "--url", "amqp://guest:secret@127.0.0.1:1/", "--name", "x", "--permits", "1"}, exitUnavailable, "", "broker unreachable"},
		{"amqps unreachable", []string{"status", "--url", "amqps://127.0.0.1:1/", "--name", "x"}, exitUnavailable, "", "broker unreachable"},
		{"not a url", []string{"status", "--url", "localhost", "--name", "x"}, exitUsage, "", "not a broker URL"},
		{"other scheme", []string{"status", "--url", "http://127.0.0.1:1", "--name", "x"}, exitUsage, "", `scheme "http"`},
		{"mixed list", []string{"status", "--url", "nats://127.0.0.1:1,amqp://u:secret@127.0.0.1:2/", "--name", "x"}, exitUsage, "", "mixes brokers"},
		{"bad url in list", []string{"status", "--url", "amqp://127.0.0.1:1/,localhost", "--name", "x"}, exitUsage, "", "not a broker URL"},
		{"amqp list unreachable", []string{"status", "--url", "amqp://u:secret@127.0.0.1:1/,amqp://u:secret@127.0.0.1:2/", "--name", "x"}, exitUnavailable, "", "127.0.0.1:2"},
		{"missing key file", []string{"status", "--url", unreachable, "--name", "x", "--key-file", "/nonexistent/key"}, exitUsage, "", "key file"},
		{"server extra arg", []string{"server", "extra"}, exitUsage, "", `unexpected argument "extra"`},
		{"server bad listen", []string{"server", "--listen", "foo"}, exitUsage, "", "--listen"},
		{"server bad sync", []string{"server", "--listen", "127.0.0.1:0", "--sync", "sometimes"}, exitUsage, "", "want always or interval"},
		{"server sync interval with always", []string{"server", "--listen", "127.0.0.1:0", "--sync", "always", "--sync-interval", "1s"}, exitUsage, "", "sync interval"},
		{"server routes without cluster", []string{"server", "--listen", "127.0.0.1:0", "--routes", "nats-route://127.0.0.1:1"}, exitUsage, "", "cluster listen address"},
		{"server cluster name without cluster", []string{"server", "--listen", "127.0.0.1:0", "--cluster-name", "c"}, exitUsage, "", "cluster listen address"},
		{"server cluster without name", []string{"server", "--listen", "127.0.0.1:0", "--store", "/nonexistent", "--cluster-listen", "127.0.0.1:0",
			"--routes", "nats-route://127.0.0.1:1"}, exitUsage, "", "server name"},
		{"server cluster without store", []string{"server", "--listen", "127.0.0.1:0", "--server-name", "n0", "--cluster-listen", "127.0.0.1:0",
			"--routes", "nats-route://127.0.0.1:1"}, exitUsage, "", "store directory"},
		{"server cluster without routes", []string{"server", "--listen", "127.0.0.1:0", "--server-name", "n0", "--store", "/nonexistent",
			"--cluster-listen", "127.0.0.1:0"}, exitUsage, "", "routes"},
		{"server bad route", []string{"server", "--listen", "127.0.0.1:0", "--server-name", "n0", "--store", "/nonexistent",
			"--cluster-listen", "127.0.0.1:0", "--routes", "nats-route://127.0.0.1:1,nats://127.0.0.1:2"}, exitUsage, "", `route "nats://127.0.0.1:2"`},
		{"server bad cluster listen", []string{"server", "--listen", "127.0.0.1:0", "--server-name", "n0", "--store", "/nonexistent",
			"--cluster-listen", "127.0.0.1", "--routes", "nats-route://127.0.0.1:1"}, exitUsage, "", "cluster listen address"},
		{"verb help", []string{"status", "-h"}, exitOK, "Usage:\n  seminit status", ""},
		{"exec help", []string{"exec", "--help"}, exitOK, "--wait duration\n      give up (exit 75)", ""},
		{"zero timeout", []string{"status", "--url", unreachable, "--name", "x", "--timeout", "0s"}, exitUsage, "", "--timeout"},
		{"bad log level", []string{"status", "--url", unreachable, "--name", "x", "--log-level", "loud"}, exitUsage, "", "want debug, info, warn or error"},
		{"exec negative max-hold", []string{"exec", "--url", unreachable, "--name", "x", "--max-hold", "-1s", "--", "true"}, exitUsage, "", "must not be negative"},
		// A 0 that would silently mean a default is an error; the others
		// are documented.
		{"init zero lease", []string{"init", "--url", unreachable, "--name", "x", "--permits", "1", "--lease", "0"}, exitUsage, "", "--lease 0s: want a positive duration (leave --lease out for the default, 15s)"},
		{"init zero lease amqp", []string{"init", "--url", "amqp://127.0.0.1:1/", "--name", "x", "--permits", "1", "--lease", "0s"}, exitUsage, "", "--lease 0s: want a positive duration"},
		{"init zero replicas", []string{"init", "--url", unreachable, "--name", "x", "--permits", "1", "--replicas", "0"}, exitUsage, "", "--replicas 0: want 1 or 3"},
		{"exec zero max-hold", []string{"exec", "--url", unreachable, "--name", "x", "--max-hold", "0", "--", "true"}, exitUsage, "", "--max-hold 0: want a positive duration"},
		{"exec zero lease", []string{"exec", "--url", unreachable, "--name", "x", "--lease", "0s", "--", "true"}, exitUsage, "", "--lease 0: want a positive duration"},
		{"reconcile zero watch", []string{"reconcile", "--url", unreachable, "--name", "x", "--watch", "0s"}, exitUsage, "", "--watch 0: want a positive interval"},
		{"server zero sync interval", []string{"server", "--listen", "127.0.0.1:0", "--sync", "interval", "--sync-interval", "0s"}, exitUsage, "", "--sync-interval 0s: want a positive duration"},
		{"exec wait 0 documented", []string{"exec", "--help"}, exitOK, "0 tries once", ""},
		{"resize step 0 documented", []string{"resize", "--help"}, exitOK, "(0, the default: all at once)", ""},
		{"resize interval 0 documented", []string{"resize", "--help"}, exitOK, "pause between steps (0: none)", ""},
		{"help VERB is VERB --help", []string{"help", "exec"}, exitOK, "--kill-after", ""},
		{"help of an unknown verb", []string{"help", "exe"}, exitUsage, "", `did you mean "exec"?`},
		{"flag typo suggests", []string{"exec", "--naem", "x", "--", "true"}, exitUsage, "", "--naem (did you mean --name?)"},
		{"timeout default documented", []string{"status", "--help"}, exitOK, "min(5s, lease/4)", ""},
		{"name twice", []string{"exec", "--url", unreachable, "--name", "x", "--name", "x", "--", "true"}, exitUsage, "", "--name x is given twice"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			got := run(t.Context(), nil, tc.args, &stdout, &stderr)
			if got != tc.want {
				t.Fatalf("run %q = %d, want %d\nstdout: %s\nstderr: %s", tc.args, got, tc.want, stdout.String(), stderr.String())
			}
			if !strings.Contains(stdout.String(), tc.wantStdout) {
				t.Errorf("stdout = %q, want it to contain %q", stdout.String(), tc.wantStdout)
			}
			if !strings.Contains(stderr.String(), tc.wantStderr) {
				t.Errorf("stderr = %q, want it to contain %q", stderr.String(), tc.wantStderr)
			}
			if strings.Contains(stderr.String(), "secret") {
				t.Errorf("stderr shows the URL's password: %q", stderr.String())
			}
		})
	}
}

// TestBrokerErrors covers exit codes that need a broker (or its absence),
// on NATS; TestAMQPBrokerErrors covers RabbitMQ.
func TestBrokerErrors(t *testing.T) {
	nats := natsBroker()
	missing := uniqueName(t)
	tests := []struct {
		name       string
		args       []string
		want       int
		wantStderr string
	}{
		{"status not initialized", []string{"status", "--name", missing}, exitConfig, "not initialized"},
		{"status --json not initialized", []string{"status", "--json", "--name", missing}, exitConfig, "not initialized"},
		{"exec not initialized", []string{"exec", "--name", missing, "--", "true"}, exitConfig, "not initialized"},
		{"init lease too short", []string{"init", "--name", missing, "--permits", "1", "--lease", "1ms"}, exitUsage, "invalid option"},
		{"status unreachable", []string{"status", "--url", unreachable, "--name", "x"}, exitUnavailable, "127.0.0.1:1"},
		{"init unreachable", []string{"init", "--url", unreachable, "--name", "x", "--permits", "1"}, exitUnavailable, "127.0.0.1:1"},
		{"exec unreachable", []string{"exec", "--url", unreachable, "--name", "x", "--", "true"}, exitUnavailable, "127.0.0.1:1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := nats.seminit(t, tc.args...)
			if r.code != tc.want {
				t.Fatalf("seminit %q: %v\nwant exit %d", tc.args, r, tc.want)
			}
			if !strings.Contains(r.stderr, tc.wantStderr) {
				t.Errorf("stderr = %q, want it to contain %q", r.stderr, tc.wantStderr)
			}
			if r.stdout != "" {
				t.Errorf("stdout = %q, want nothing on failure", r.stdout)
			}
		})
	}
	// The failed init must not have created the semaphore.
	if r := nats.seminit(t, "status", "--name", missing); r.code != exitConfig {
		t.Fatalf("status after a refused init: %v", r)
	}
}

// statusJSON is the --json status, decoded twice: typed and raw.
func (b broker) statusJSON(t *testing.T, name string) (map[string]any, statusDoc) {
	t.Helper()
	r := b.seminit(t, "status", "--json", "--name", name)
	if r.code != exitOK {
		t.Fatalf("status --json: %v", r)
	}
	var raw map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &raw); err != nil {
		t.Fatalf("status --json is not JSON: %v\n%s", err, r.stdout)
	}
	var doc statusDoc
	if err := json.Unmarshal([]byte(r.stdout), &doc); err != nil {
		t.Fatalf("status --json: %v\n%s", err, r.stdout)
	}
	return raw, doc
}

type statusDoc struct {
	Name       string `json:"name"`
	Backend    string `json:"backend"`
	Resource   string `json:"resource"`
	Permits    int    `json:"permits"`
	Tokens     int    `json:"tokens"`
	Available  int    `json:"available"`
	Held       int    `json:"held"`
	Waiting    int    `json:"waiting"`
	Duplicates []int  `json:"duplicates"`
	Missing    []int  `json:"missing"`
	Invalid    int    `json:"invalid"`
	Healthy    bool   `json:"healthy"`
}

func TestInitStatus(t *testing.T) { forEachBroker(t, testInitStatus) }

func testInitStatus(t *testing.T, b broker) {
	name := uniqueName(t)
	r := b.seminit(t, "init", "--name", name, "--permits", "3", "--log-level", "info")
	if r.code != exitOK || !strings.Contains(r.stdout, name+" ready: 3 permits") || !strings.Contains(r.stdout, "healthy") {
		t.Fatalf("init: %v", r)
	}
	if !strings.Contains(r.stderr, "level=INFO msg=\"semaphore created\"") {
		t.Errorf("init --log-level info: stderr %q, want the library's log of the creation", r.stderr)
	}
	r = b.seminit(t, "init", "--name", name, "--permits", "3")
	if r.code != exitOK || !strings.Contains(r.stdout, name+" ready: 3 permits") {
		t.Fatalf("second identical init: %v", r)
	}
	r = b.seminit(t, "init", "--name", name, "--permits", "4")
	if r.code != exitConfig || !strings.Contains(r.stderr, "mismatch") {
		t.Fatalf("init with another --permits: %v\nwant exit %d and \"mismatch\"", r, exitConfig)
	}
	if b.name == "nats" {
		// The lease is fixed at creation: asking for another one is a
		// mismatch naming both, not a silent success.
		r = b.seminit(t, "init", "--name", name, "--permits", "3", "--lease", "7s")
		if r.code != exitConfig || !strings.Contains(r.stderr, "lease of 15s, not 7s") {
			t.Fatalf("init with another --lease: %v\nwant exit %d naming both leases", r, exitConfig)
		}
	}

	raw, st := b.statusJSON(t, name)
	for _, field := range []string{"name", "backend", "resource", "permits", "tokens", "available", "held", "waiting", "duplicates", "missing", "invalid", "healthy"} {
		if _, ok := raw[field]; !ok {
			t.Errorf("status --json has no %q: %v", field, raw)
		}
	}
	for _, field := range []string{"duplicates", "missing", "holders", "warnings"} {
		if _, ok := raw[field].([]any); !ok {
			t.Errorf("status --json %q = %#v, want a JSON list", field, raw[field])
		}
	}
	store := b.prefix + name
	want := statusDoc{Name: name, Backend: b.name, Resource: store, Permits: 3, Tokens: 3, Available: 3,
		Duplicates: []int{}, Missing: []int{}, Healthy: true}
	if fmt.Sprint(st) != fmt.Sprint(want) {
		t.Errorf("status --json = %+v\nwant %+v", st, want)
	}

	r = b.seminit(t, "status", "--name", name)
	if r.code != exitOK || !strings.Contains(r.stdout, fmt.Sprintf("%s status: 3 permits (%s %s,", name, b.name, store)) ||
		!strings.Contains(r.stdout, "tokens 3, available 3, held 0, waiting 0") {
		t.Errorf("status: %v", r)
	}
	r = b.seminit(t, "status", "--name", name, "--count")
	if r.code != exitOK || r.stdout != name+": 3 permits, available 3, held 0, waiting 0\n" {
		t.Errorf("status --count: %v", r)
	}
	r = b.seminit(t, "status", "--name", name, "--count", "--json")
	var count struct {
		Name                              string
		Permits, Available, Held, Waiting int
	}
	if r.code != exitOK || json.Unmarshal([]byte(r.stdout), &count) != nil ||
		count.Name != name || count.Permits != 3 || count.Available != 3 || count.Held != 0 || count.Waiting != 0 {
		t.Errorf("status --count --json: %v", r)
	}
}

func TestExecExitStatus(t *testing.T) { forEachBroker(t, testExecExitStatus) }

func testExecExitStatus(t *testing.T, b broker) {
	name := uniqueName(t)
	b.mustInit(t, name, 1)
	tests := []struct {
		name string
		argv []string
		want int
	}{
		{"success", []string{"true"}, 0},
		{"exit 7", []string{"sh", "-c", "exit 7"}, 7},
		{"killed by signal", []string{"sh", "-c", "kill -KILL $$"}, 128 + int(syscall.SIGKILL)},
		{"no such command", []string{"/nonexistent/command"}, 127},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"exec", "--name", name, "--wait", "10s", "--"}, tc.argv...)
			if r := b.seminit(t, args...); r.code != tc.want {
				t.Fatalf("seminit %q: %v\nwant exit %d", args, r, tc.want)
			}
		})
	}
	// Every run released its permit.
	if r := b.seminit(t, "exec", "--name", name, "--wait", "5s", "--", "true"); r.code != exitOK {
		t.Fatalf("exec after the others: %v", r)
	}
}

func TestExecEnv(t *testing.T) { forEachBroker(t, testExecEnv) }

func testExecEnv(t *testing.T, b broker) {
	const n = 3
	name := uniqueName(t)
	b.mustInit(t, name, n)
	script := `printf '%s|%s|%s\n' "$TOKENSEM_NAME" "$TOKENSEM_SLOT" "$TOKENSEM_FENCE"`
	for i := range 2 {
		r := b.seminit(t, "exec", "--name", name, "--wait", "10s", "--", "sh", "-c", script)
		if r.code != exitOK {
			t.Fatalf("exec: %v", r)
		}
		parts := strings.Split(strings.TrimSpace(r.stdout), "|")
		if len(parts) != 3 {
			t.Fatalf("child printed %q, want NAME|SLOT|FENCE", r.stdout)
		}
		if parts[0] != name {
			t.Errorf("TOKENSEM_NAME = %q, want %q", parts[0], name)
		}
		slot, err := strconv.Atoi(parts[1])
		if err != nil || slot < 0 || slot >= n {
			t.Errorf("TOKENSEM_SLOT = %q, want an integer in [0, %d)", parts[1], n)
		}
		fence, err := strconv.ParseUint(parts[2], 10, 64)
		if err != nil || fence == 0 {
			t.Errorf("TOKENSEM_FENCE = %q, want a positive integer", parts[2])
		}
		t.Logf("run %d: slot %d fence %d", i, slot, fence)
	}
}

// holder starts `seminit exec` on name on the broker, running a shell that
// prints its pid and then becomes `sleep secs`; it returns once the child
// runs, with the child's pid (also its process group id). The cleanup kills
// the group.
func (b broker) holder(t *testing.T, name string, secs int, extra ...string) (*proc, int) {
	t.Helper()
	args := append([]string{"exec", "--name", name}, extra...)
	args = append(args, "--", "sh", "-c", "echo $$; exec sleep "+strconv.Itoa(secs))
	p := startSeminit(t, b.env(), args...)
	line := p.waitLine(20 * time.Second)
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pid <= 0 {
		t.Fatalf("holder printed %q, want its pid", line)
	}
	t.Cleanup(func() { _ = syscall.Kill(-pid, syscall.SIGKILL) })
	return p, pid
}

func TestExecWaitTimeout(t *testing.T) { forEachBroker(t, testExecWaitTimeout) }

func testExecWaitTimeout(t *testing.T, b broker) {
	name := uniqueName(t)
	b.mustInit(t, name, 1)
	b.holder(t, name, 5)
	r := b.seminit(t, "exec", "--name", name, "--wait", "300ms", "--", "echo", "must not run")
	if r.code != exitNoPermit {
		t.Fatalf("exec --wait 300ms while the only permit is held: %v\nwant exit %d", r, exitNoPermit)
	}
	if r.elapsed > 3*time.Second {
		t.Errorf("exec --wait 300ms took %v", r.elapsed)
	}
	if strings.Contains(r.stdout, "must not run") {
		t.Errorf("the command ran without a permit: %q", r.stdout)
	}
	if !strings.Contains(r.stderr, "no permit") {
		t.Errorf("stderr = %q, want it to say \"no permit\"", r.stderr)
	}
	t.Logf("exec --wait 300ms gave up after %v", r.elapsed.Round(time.Millisecond))

	// --wait 0 tries once, as flock -w 0 does: no wait for a release.
	r = b.seminit(t, "exec", "--name", name, "--wait", "0", "--", "echo", "must not run")
	if r.code != exitNoPermit || !strings.Contains(r.stderr, "free now") || strings.Contains(r.stdout, "must not run") {
		t.Fatalf("exec --wait 0 while the only permit is held: %v\nwant exit %d saying no permit is free now", r, exitNoPermit)
	}
	t.Logf("exec --wait 0 gave up after %v", r.elapsed.Round(time.Millisecond))
	// --conflict-exit-code tells seminit's giving up from the command's own 75.
	r = b.seminit(t, "exec", "--name", name, "--wait", "0", "--conflict-exit-code", "3", "--", "true")
	if r.code != 3 || !strings.Contains(r.stderr, "free now") {
		t.Fatalf("exec --wait 0 --conflict-exit-code 3 while the permit is held: %v\nwant exit 3", r)
	}
	free := uniqueName(t)
	b.mustInit(t, free, 1)
	if r := b.seminit(t, "exec", "--name", free, "--wait", "0", "--", "echo", "ran"); r.code != exitOK || !strings.Contains(r.stdout, "ran") {
		t.Fatalf("exec --wait 0 with a free permit: %v", r)
	}
	_, st := b.statusJSON(t, name)
	if st.Held != 1 || st.Available != 0 || !st.Healthy {
		t.Errorf("status with one holder = %+v", st)
	}
}

func TestExecLeaseLimit(t *testing.T) { forEachBroker(t, testExecLeaseLimit) }

func testExecLeaseLimit(t *testing.T, b broker) {
	name := uniqueName(t)
	b.mustInit(t, name, 1)
	p, pid := b.holder(t, name, 30, "--max-hold", "300ms")
	r := p.wait(10 * time.Second)
	if r.code != exitHoldLimit {
		t.Fatalf("exec --max-hold 300ms -- sleep 30: %v\nwant exit %d", r, exitHoldLimit)
	}
	if !strings.Contains(r.stderr, "--max-hold") {
		t.Errorf("stderr = %q, want it to name --max-hold", r.stderr)
	}
	if alive(pid) {
		t.Errorf("child %d still running after seminit exited", pid)
	}
	if r := b.seminit(t, "exec", "--name", name, "--wait", "5s", "--", "true"); r.code != exitOK {
		t.Fatalf("exec after the --max-hold stop: %v\nthe permit did not come back", r)
	}
}

func TestExecSIGTERM(t *testing.T) { forEachBroker(t, testExecSIGTERM) }

func testExecSIGTERM(t *testing.T, b broker) {
	name := uniqueName(t)
	b.mustInit(t, name, 1)
	p, pid := b.holder(t, name, 30)
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	r := p.wait(10 * time.Second)
	if r.code != 128+int(syscall.SIGTERM) {
		t.Fatalf("seminit exec after SIGTERM: %v\nwant exit %d", r, 128+int(syscall.SIGTERM))
	}
	if alive(pid) {
		t.Errorf("child %d still running after seminit exited", pid)
	}
	if r := b.seminit(t, "exec", "--name", name, "--wait", "5s", "--", "true"); r.code != exitOK {
		t.Fatalf("exec after SIGTERM of the holder: %v\nthe permit did not come back", r)
	}
}

// TestExecInterruptedWaiting checks a SIGTERM while waiting for a permit.
func TestExecInterruptedWaiting(t *testing.T) { forEachBroker(t, testExecInterruptedWaiting) }

func testExecInterruptedWaiting(t *testing.T, b broker) {
	name := uniqueName(t)
	b.mustInit(t, name, 1)
	b.holder(t, name, 30)
	if _, st := b.statusJSON(t, name); st.Waiting != 0 {
		t.Fatalf("status with one holder and nobody waiting = %+v", st)
	}
	w := startSeminit(t, b.env(), "exec", "--name", name, "--", "echo", "must not run")
	eventually(t, 10*time.Second, "second exec waiting", func() bool {
		_, st := b.statusJSON(t, name)
		return st.Waiting == 1
	})
	if err := w.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	r := w.wait(10 * time.Second)
	if r.code != 128+int(syscall.SIGTERM) || strings.Contains(r.stdout, "must not run") {
		t.Fatalf("SIGTERM while waiting: %v\nwant exit 143 (128+SIGTERM) and no command run", r)
	}
	t.Logf("SIGTERM while waiting for a permit: exit %d", r.code)
	eventually(t, 10*time.Second, "no waiter left", func() bool {
		_, st := b.statusJSON(t, name)
		return st.Waiting == 0 && st.Held == 1 && st.Healthy
	})
}

// meter counts the meterChild processes inside their critical section.
// It answers a child's "enter" only once permits children are inside
// together (or fillWait has passed), so that the holders of every permit
// provably overlap: on a loaded machine their short windows need not.
type meter struct {
	l       net.Listener
	wg      sync.WaitGroup
	permits int

	mu       sync.Mutex
	filled   *sync.Cond // on mu: broadcast when an enter fills every permit, and on a wait's timeout
	fills    int        // enters that made inside == permits
	inside   int
	max      int
	enters   int
	leaves   int
	died     int            // children whose connection closed inside (counted in leaves)
	entered  []time.Time    // when each enter arrived
	slots    map[int]bool   // slots of the children inside now
	fences   map[int]uint64 // last fence seen per slot
	problems []string
	conns    map[net.Conn]bool
}

// fillWait bounds how long the meter holds an "enter" for the other
// permits to fill: the last child of a run has nobody left to wait for.
const fillWait = 3 * time.Second

func startMeter(t *testing.T, permits int) *meter {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := &meter{l: l, permits: permits, slots: map[int]bool{}, fences: map[int]uint64{}, conns: map[net.Conn]bool{}}
	m.filled = sync.NewCond(&m.mu)
	m.wg.Go(m.accept)
	t.Cleanup(func() {
		_ = l.Close()
		m.mu.Lock()
		for c := range m.conns {
			_ = c.Close()
		}
		m.mu.Unlock()
		m.wg.Wait()
	})
	return m
}

func (m *meter) accept() {
	for {
		c, err := m.l.Accept()
		if err != nil {
			return
		}
		m.mu.Lock()
		m.conns[c] = true
		m.mu.Unlock()
		m.wg.Go(func() { m.serve(c) })
	}
}

func (m *meter) serve(c net.Conn) {
	defer func() {
		m.mu.Lock()
		delete(m.conns, c)
		m.mu.Unlock()
		_ = c.Close()
	}()
	slot, in := -1, false
	defer func() {
		// A child killed inside (exec stops its command when the permit
		// is lost) has left when its connection closes.
		if in {
			m.mu.Lock()
			m.inside--
			m.leaves++
			m.died++
			delete(m.slots, slot)
			m.mu.Unlock()
		}
	}()
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		m.mu.Lock()
		switch {
		case len(f) == 3 && f[0] == "enter":
			m.inside++
			m.enters++
			m.entered = append(m.entered, time.Now())
			m.max = max(m.max, m.inside)
			s, err1 := strconv.Atoi(f[1])
			fence, err2 := strconv.ParseUint(f[2], 10, 64)
			switch {
			case err1 != nil || err2 != nil:
				m.problems = append(m.problems, fmt.Sprintf("bad enter %q", sc.Text()))
			case m.slots[s]:
				m.problems = append(m.problems, fmt.Sprintf("slot %d entered twice at once", s))
			case fence <= m.fences[s]:
				m.problems = append(m.problems, fmt.Sprintf("slot %d: fence %d after %d", s, fence, m.fences[s]))
			}
			if err1 == nil {
				slot = s
				m.slots[s] = true
				m.fences[s] = max(m.fences[s], fence)
			}
			in = true
			m.waitFilled()
		case len(f) == 1 && f[0] == "leave":
			m.inside--
			m.leaves++
			in = false
			delete(m.slots, slot)
		default:
			m.problems = append(m.problems, fmt.Sprintf("unknown message %q", sc.Text()))
		}
		m.mu.Unlock()
		if _, err := c.Write([]byte("ok\n")); err != nil {
			return
		}
	}
}

// waitFilled, called with mu held by a child that just entered, returns
// once every permit was held at once since then (this child is inside
// until it leaves, which it does only after the reply), or after fillWait.
func (m *meter) waitFilled() {
	if m.inside >= m.permits {
		m.fills++
		m.filled.Broadcast()
		return
	}
	since, expired := m.fills, false
	timer := time.AfterFunc(fillWait, func() {
		m.mu.Lock()
		expired = true
		m.filled.Broadcast()
		m.mu.Unlock()
	})
	defer timer.Stop()
	for m.fills == since && !expired {
		m.filled.Wait()
	}
}

// TestExecAtMostN runs 8 seminit exec processes at once on a semaphore of
// 2 permits, twice over; their children report to a meter, which holds
// each one inside until both permits' children are (see meter).
func TestExecAtMostN(t *testing.T) { forEachBroker(t, testExecAtMostN) }

func testExecAtMostN(t *testing.T, b broker) {
	const (
		permits = 2
		procs   = 8
		rounds  = 2
	)
	name := uniqueName(t)
	b.mustInit(t, name, permits)
	m := startMeter(t, permits)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// A race-enabled test binary sleeps 1s at exit unless told not to.
	env := b.env(meterChildEnv+"="+m.l.Addr().String(),
		"GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))

	start := time.Now()
	results := make([][rounds]result, procs)
	var wg sync.WaitGroup
	for i := range procs {
		wg.Go(func() {
			for j := range rounds {
				// Not t.Fatal in a goroutine: wait records a timeout as exit -2.
				p := startSeminit(t, env, "exec", "--name", name, "--wait", "30s", "--", self)
				select {
				case <-p.done:
					results[i][j] = p.res
				case <-time.After(40 * time.Second):
					results[i][j] = result{code: -2, stderr: "still running after 40s"}
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d x %d exec runs took %v", procs, rounds, time.Since(start).Round(time.Millisecond))
	for i := range results {
		for j, r := range results[i] {
			if r.code != exitOK {
				t.Errorf("process %d round %d: %v", i, j, r)
			}
		}
	}

	m.mu.Lock()
	defer m.mu.Unlock()
	t.Logf("meter: max %d inside, %d enters (%d filled every permit), %d leaves, last fences %v",
		m.max, m.enters, m.fills, m.leaves, m.fences)
	if m.max > permits {
		t.Errorf("%d children inside at once with %d permits", m.max, permits)
	}
	if m.max != permits {
		t.Errorf("at most %d children inside at once: the test never reached the %d permits", m.max, permits)
	}
	if m.enters != procs*rounds || m.leaves != procs*rounds || m.inside != 0 {
		t.Errorf("enters %d, leaves %d, inside %d; want %d, %d, 0", m.enters, m.leaves, m.inside, procs*rounds, procs*rounds)
	}
	for _, p := range m.problems {
		t.Error(p)
	}
}

// TestExecHolderKilled kills -9 a seminit exec holding the only permit:
// the permit must come back, on NATS once its lease runs out, on RabbitMQ
// as soon as the broker sees the holder's connection close.
func TestExecHolderKilled(t *testing.T) { forEachBroker(t, testExecHolderKilled) }

func testExecHolderKilled(t *testing.T, b broker) {
	const lease = 2 * time.Second
	name := uniqueName(t)
	bound, how := 5*time.Second, "lease: until the connection drops"
	if b.leases {
		b.mustInit(t, name, 1, "--lease", lease.String())
		bound, how = 15*time.Second, "lease "+lease.String()
	} else {
		b.mustInit(t, name, 1)
	}
	p, pid := b.holder(t, name, 30)
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	next := startSeminit(t, b.env(), "exec", "--name", name, "--wait", "15s", "--", "true")
	if r := p.wait(10 * time.Second); r.code != -1 {
		t.Fatalf("seminit after kill -9: %v", r)
	}
	r := next.wait(20 * time.Second)
	recovered := time.Since(killed)
	if r.code != exitOK {
		t.Fatalf("exec --wait 15s after kill -9 of the holder: %v", r)
	}
	t.Logf("%s: permit back %v after kill -9 of its holder (%s)", b.name, recovered.Round(time.Millisecond), how)
	// The child dies with its holder (parent-death signal), so it does not
	// go on using the resource once the permit is handed on.
	if alive(pid) {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		t.Errorf("the killed holder's child %d was still running when the permit was handed on", pid)
	}
	if recovered > bound {
		t.Errorf("recovery took %v, want at most %v", recovered, bound)
	}
	_, st := b.statusJSON(t, name)
	if !st.Healthy || st.Held != 0 || st.Available != 1 {
		t.Errorf("status after recovery = %+v", st)
	}
}

// TestExecPermitLost freezes a holder (SIGSTOP) past its lease: another
// exec takes the permit over, and once thawed the holder stops its child
// and exits 70. NATS only: RabbitMQ has no lease, and would drop a frozen
// holder only after two heartbeats (10s).
func TestExecPermitLost(t *testing.T) {
	const lease = time.Second
	nats := natsBroker()
	name := uniqueName(t)
	nats.mustInit(t, name, 1, "--lease", lease.String())
	p, pid := nats.holder(t, name, 30)
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	t.Cleanup(func() { _ = p.cmd.Process.Signal(syscall.SIGCONT) })

	r := nats.seminit(t, "exec", "--name", name, "--wait", "15s", "--", "true")
	if r.code != exitOK {
		t.Fatalf("exec --wait 15s while the holder is frozen: %v", r)
	}
	t.Logf("permit taken over %v after SIGSTOP of its holder (lease %v)", time.Since(stopped).Round(time.Millisecond), lease)
	if !alive(pid) {
		t.Errorf("the frozen holder's child %d is gone before the holder thawed", pid)
	}

	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	r = p.wait(15 * time.Second)
	if r.code != exitSoftware || !strings.Contains(r.stderr, "permit lost") {
		t.Fatalf("thawed holder: %v\nwant exit %d and \"permit lost\"", r, exitSoftware)
	}
	if alive(pid) {
		t.Errorf("child %d still running after its holder lost the permit", pid)
	}
	_, st := nats.statusJSON(t, name)
	if !st.Healthy || st.Held != 0 || st.Available != 1 {
		t.Errorf("status after the takeover = %+v", st)
	}
}

// TestExecPriority: with the only permit held, an exec of class -2 queues,
// then one of class 3; on release the class-3 command runs first. A class
// out of range is a usage error.
func TestExecPriority(t *testing.T) { forEachBroker(t, testExecPriority) }

func testExecPriority(t *testing.T, b broker) {
	name := uniqueName(t)
	b.mustInit(t, name, 1)
	if r := b.seminit(t, "exec", "--name", name, "--priority", "6", "--", "true"); r.code != exitUsage || !strings.Contains(r.stderr, "--priority 6") {
		t.Fatalf("exec --priority 6: %v, want exit %d naming the flag", r, exitUsage)
	}
	holder, pid := b.holder(t, name, 60)
	order := filepath.Join(t.TempDir(), "order")
	var waiters []*proc
	for i, class := range []string{"-2", "3"} {
		script := "echo " + class + " >> " + order
		waiters = append(waiters, startSeminit(t, b.env(), "exec", "--name", name, "--priority", class, "--wait", "30s", "--", "sh", "-c", script))
		eventually(t, 20*time.Second, "exec --priority "+class+" waiting", func() bool {
			_, st := b.statusJSON(t, name)
			return st.Waiting >= i+1
		})
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL) // the command dies: seminit releases and exits
	if r := holder.wait(20 * time.Second); r.code != 128+int(syscall.SIGKILL) {
		t.Fatalf("holder after its command was killed: %v", r)
	}
	for _, w := range waiters {
		if r := w.wait(30 * time.Second); r.code != exitOK {
			t.Fatalf("waiter: %v", r)
		}
	}
	got, err := os.ReadFile(order)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != "3\n-2\n" {
		t.Fatalf("commands ran in the order %q, want class 3 first, then -2", got)
	}
}

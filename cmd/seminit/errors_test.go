package main

import (
	"encoding/json"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tokensem/tokensem/internal/freeport"
)

// TestInitRefusedReplicas: `init --replicas 3` on a single server is
// refused for good: seminit fails at once, exit 78, naming the server's
// reason and the fix on one line each, without retrying it.
func TestInitRefusedReplicas(t *testing.T) {
	nats := natsBroker()
	name := uniqueName(t)
	r := nats.seminit(t, "init", "--name", name, "--permits", "2", "--replicas", "3")
	if r.code != exitConfig || !strings.Contains(r.stderr, "replicas > 1 not supported") ||
		!strings.Contains(r.stderr, "ask for 1 replica") || strings.Contains(r.stderr, "retrying") {
		t.Fatalf("init --replicas 3 on one server: %v\nwant exit %d, the server's reason and the fix, no retries", r, exitConfig)
	}
	if r := nats.seminit(t, "status", "--name", name); r.code != exitConfig {
		t.Errorf("status after the refused init: %v\nwant exit %d (not initialized)", r, exitConfig)
	}
}

// TestWrongProtocolPort: a nats:// URL for a port that accepts the
// connection but says nothing (as RabbitMQ's does) fails saying it is not
// a NATS port, not "i/o timeout" after the request timeout.
func TestWrongProtocolPort(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { _ = c.Close() })
		}
	}()
	b := broker{name: "nats", url: "nats://" + l.Addr().String()}
	r := b.seminit(t, "status", "--name", uniqueName(t), "--timeout", "30s")
	if r.code != exitUnavailable || !strings.Contains(r.stderr, "no NATS greeting") || strings.Contains(r.stderr, "i/o timeout") {
		t.Fatalf("status against a silent port: %v\nwant exit %d saying it sent no NATS greeting", r, exitUnavailable)
	}
}

// TestErrorsNameTheFix: the errors a newcomer meets first say what to run
// next.
func TestErrorsNameTheFix(t *testing.T) {
	nats := natsBroker()
	name := uniqueName(t)
	r := nats.seminit(t, "exec", "--name", name, "--", "true")
	if r.code != exitConfig || !strings.Contains(r.stderr, "seminit init --name "+name+" --permits N") {
		t.Errorf("exec of a semaphore never made: %v\nwant exit %d naming init", r, exitConfig)
	}
	nats.mustInit(t, name, 1)
	r = nats.seminit(t, "init", "--name", name, "--permits", "2")
	if r.code != exitConfig || !strings.Contains(r.stderr, "seminit resize --name "+name+" --permits 2") {
		t.Errorf("init with another count: %v\nwant exit %d naming resize", r, exitConfig)
	}
	nats.holder(t, name, 30)
	r = nats.seminit(t, "delete", "--name", name)
	if r.code != exitNoPermit || !strings.Contains(r.stderr, "seminit delete --force --name "+name) {
		t.Errorf("delete while a permit is held: %v\nwant exit %d naming --force", r, exitNoPermit)
	}
	r = nats.seminit(t, "exec", "--name", name, "--name", name, "--", "true")
	if r.code != exitUsage || strings.Contains(r.stderr, "*natssem") || !strings.Contains(r.stderr, "given twice") {
		t.Errorf("exec --name X --name X: %v\nwant exit %d saying so, without Go types", r, exitUsage)
	}
	nobody := broker{name: "nats", url: "nats://" + freeport.Need(t, 1)[0]}
	r = nobody.seminit(t, "status", "--name", name)
	if r.code != exitUnavailable || !strings.Contains(r.stderr, "seminit server") {
		t.Errorf("status with no server there: %v\nwant exit %d naming seminit server", r, exitUnavailable)
	}
}

// TestServerNamesWhatFailed: `seminit server` with a store it cannot
// make says so at once, instead of blaming the port after 10 s.
func TestServerNamesWhatFailed(t *testing.T) {
	r := startSeminit(t, nil, "server", "--listen", freeport.Need(t, 1)[0], "--store", "/proc/no-such-store").wait(30 * time.Second)
	if r.code == exitOK || !strings.Contains(r.stderr, "storage directory") || strings.Contains(r.stderr, "port") {
		t.Fatalf("server --store /proc/no-such-store: %v\nwant a failure naming the store", r)
	}
}

// TestExecReportsWaiting: with --verbose (or on a terminal) exec says
// that it waits, for what, and what the broker says of the semaphore.
func TestExecReportsWaiting(t *testing.T) {
	nats := natsBroker()
	name := uniqueName(t)
	nats.mustInit(t, name, 1)
	nats.holder(t, name, 30)
	r := nats.seminit(t, "exec", "--verbose", "--name", name, "--wait", "2s", "--", "true")
	if r.code != exitNoPermit || !strings.Contains(r.stderr, "seminit exec: waiting") ||
		!strings.Contains(r.stderr, "for a permit of "+name+" (1 of 1 held, 1 waiting with this one)") {
		t.Fatalf("exec --verbose while the only permit is held: %v\nwant a line saying it waits, for what, and the count", r)
	}
	r = nats.seminit(t, "exec", "--name", name, "--wait", "1s", "--", "true")
	if strings.Contains(r.stderr, "waiting") {
		t.Errorf("exec without --verbose, stderr no terminal: %v\nwant no progress lines", r)
	}
}

// TestExecInitPermits: exec --init-permits N makes the semaphore on first
// use, as init does: again with N is fine, with another count a mismatch.
func TestExecInitPermits(t *testing.T) { forEachBroker(t, testExecInitPermits) }

func testExecInitPermits(t *testing.T, b broker) {
	name := uniqueName(t)
	for range 2 {
		if r := b.seminit(t, "exec", "--name", name, "--init-permits", "2", "--", "true"); r.code != exitOK {
			t.Fatalf("exec --init-permits 2: %v", r)
		}
	}
	if _, st := b.statusJSON(t, name); st.Permits != 2 || st.Tokens != 2 || !st.Healthy {
		t.Fatalf("status after exec --init-permits 2: %+v", st)
	}
	r := b.seminit(t, "exec", "--name", name, "--init-permits", "3", "--", "echo", "must not run")
	if r.code != exitConfig || !strings.Contains(r.stderr, "mismatch") || strings.Contains(r.stdout, "must not run") {
		t.Fatalf("exec --init-permits 3 of a semaphore of 2: %v\nwant exit %d, a mismatch, no command run", r, exitConfig)
	}
}

// TestStatusWatch: status --watch --json prints a view a line until
// interrupted (exit 0): counts, utilization, and on NATS the holders.
func TestStatusWatch(t *testing.T) {
	nats := natsBroker()
	name := uniqueName(t)
	nats.mustInit(t, name, 2)
	nats.holder(t, name, 30)
	p := startSeminit(t, nats.env(), "status", "--name", name, "--watch", "100ms", "--json")
	eventually(t, 20*time.Second, "three refreshes", func() bool { return strings.Count(p.stdout.String(), "\n") >= 3 })
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	r := p.wait(10 * time.Second)
	if r.code != exitOK {
		t.Fatalf("status --watch after SIGINT: %v", r)
	}
	var v watchView
	line, _, _ := strings.Cut(strings.TrimSpace(r.stdout), "\n")
	if err := json.Unmarshal([]byte(line), &v); err != nil {
		t.Fatalf("status --watch --json line %q: %v", line, err)
	}
	if v.Count.Held != 1 || v.Count.Permits != 2 || v.Utilization != 0.5 || len(v.Holders) != 1 || v.Holders[0].Index != 0 {
		t.Fatalf("status --watch view = %+v, want slot 0 of 2 held, utilization 0.5", v)
	}
}

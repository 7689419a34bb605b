package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/adaptive"
	"github.com/tokensem/tokensem/amqpsem"
	"github.com/tokensem/tokensem/internal/semtest"
	"github.com/tokensem/tokensem/natssem"
)

// reporting is a library handle of a semaphore whose holders report.
type reporting interface {
	tokensem.Semaphore
	PublishReport(ctx context.Context, r adaptive.Report) error
}

// openReporting opens semaphore name with the library, on a connection of
// its own, with w observing it.
func (b broker) openReporting(t *testing.T, name string, w *adaptive.Window) reporting {
	t.Helper()
	ctx := t.Context()
	var s reporting
	var err error
	switch b.name {
	case "nats":
		nc, cerr := nats.Connect(b.url)
		if cerr != nil {
			t.Fatal(cerr)
		}
		t.Cleanup(nc.Close)
		s, err = natssem.Open(ctx, nc, name, natssem.WithObserver(w))
	default:
		c, cerr := amqpsem.Dial(ctx, b.url)
		if cerr != nil {
			t.Fatal(cerr)
		}
		t.Cleanup(func() { _ = c.Close() })
		s, err = amqpsem.Open(ctx, c, name, amqpsem.WithObserver(w))
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// adaptEvents parses the JSON lines seminit adapt --json printed so far.
func adaptEvents(t *testing.T, p *proc) []adaptEvent {
	t.Helper()
	var out []adaptEvent
	for line := range strings.SplitSeq(p.stdout.String(), "\n") {
		if !strings.HasSuffix(line, "}") {
			continue // not a whole line yet
		}
		var ev adaptEvent
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("seminit adapt printed %q: %v", line, err)
		}
		out = append(out, ev)
	}
	return out
}

func leads(evs []adaptEvent) bool {
	for _, ev := range evs {
		if ev.Event == "lead" {
			return true
		}
	}
	return false
}

// TestAdaptFailover: two seminit adapt processes control one semaphore that
// a fleet in this process uses in front of a downstream of capacity 4, its
// holders reporting their use. One leads and moves the count from 1 into
// 3..6. It is killed (SIGKILL): the other leads within the leader's lease
// (NATS: 2 s; RabbitMQ sees the connection drop), and the count stays
// where it was until it does. Never are more callers inside than the
// largest count set.
func TestAdaptFailover(t *testing.T) {
	t.Parallel()
	forEachBroker(t, func(t *testing.T, b broker) {
		t.Parallel()
		const (
			window   = "250ms"
			capacity = 4
		)
		name := uniqueName(t)
		b.mustInit(t, name, 1)
		t.Cleanup(func() {
			b.seminit(t, "delete", "--name", name, "--force")
			b.seminit(t, "delete", "--name", name+"-adapt", "--force")
		})
		args := []string{"adapt", "--name", name, "--range", "1..16", "--window", window, "--json"}
		if b.leases {
			args = append(args, "--lease", "2s")
		}
		ctls := []*proc{startSeminit(t, b.env(), args...), startSeminit(t, b.env(), args...)}

		// The fleet: two processes' worth of callers, each with a window
		// that reports to the controllers.
		ctx, stop := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		defer func() { stop(); wg.Wait() }()
		down := &semtest.Downstream{S: 50 * time.Millisecond}
		down.C.Store(capacity)
		down.Q.Store(capacity)
		var meter semtest.Meter
		var sems []reporting
		for p := range 2 {
			w := adaptive.NewWindow(name)
			s := b.openReporting(t, name, w)
			sems = append(sems, s)
			wg.Go(func() { _ = adaptive.Publish(ctx, w, fmt.Sprint("fleet-", p), 250*time.Millisecond, s.PublishReport) })
			for range 6 {
				wg.Go(func() {
					for ctx.Err() == nil {
						_ = tokensem.Do(ctx, s, func(ctx context.Context) error {
							meter.Enter()
							defer meter.Leave()
							return down.Use(ctx)
						})
					}
				})
			}
		}
		count := func() int {
			t.Helper()
			st, err := sems[0].Status(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			return st.Permits
		}

		// One leads and moves the count into range.
		eventually(t, 60*time.Second, "a controller to lead and move the count into 3..6", func() bool {
			n := count()
			return n >= 3 && n <= 6
		})
		leader := -1
		for i, c := range ctls {
			if leads(adaptEvents(t, c)) {
				leader = i
			}
		}
		if leader < 0 {
			t.Fatalf("the count moved, but no controller says it leads:\nA: %s\nB: %s", ctls[0].stdout.String(), ctls[1].stdout.String())
		}
		other := ctls[1-leader]
		if leads(adaptEvents(t, other)) {
			t.Fatalf("both controllers lead:\nA: %s\nB: %s", ctls[0].stdout.String(), ctls[1].stdout.String())
		}

		// Kill the leader. A resize it had sent may still land: the count
		// is read once its bytes are surely in.
		killed := time.Now()
		if err := ctls[leader].cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		ctls[leader].wait(10 * time.Second)
		time.Sleep(200 * time.Millisecond)
		held := count()
		for !leads(adaptEvents(t, other)) {
			if n := count(); n != held {
				t.Fatalf("with no controller leading, the count moved from %d to %d", held, n)
			}
			if time.Since(killed) > 60*time.Second {
				t.Fatalf("the other controller did not lead within 60 s of the leader's death:\n%s\nstderr: %s", other.stdout.String(), other.stderr.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
		took := time.Since(killed)
		t.Logf("the other controller led %v after the leader was killed, from %d permits", took.Round(time.Millisecond), held)
		if b.leases && took > 2*time.Second+10*time.Second {
			t.Errorf("the other controller led %v after the kill: more than the 2 s lease and 10 s to spare", took)
		}

		// It decides: the count stays in range as it goes on. seminit
		// status names it as the controller, leading, once its record is
		// written (on RabbitMQ under the creation lock, which a repair the
		// killed leader left for it may hold for W and a third).
		time.Sleep(2 * time.Second)
		want := fmt.Sprintf("(pid %d)", other.cmd.Process.Pid)
		eventually(t, 60*time.Second, "seminit status to name the controller left, leading", func() bool {
			var st struct {
				Controller *struct {
					By      string `json:"by"`
					Leader  string `json:"leader"`
					Leading *bool  `json:"leading"`
				} `json:"controller"`
			}
			res := b.seminit(t, "status", "--name", name, "--json")
			if err := json.Unmarshal([]byte(res.stdout), &st); err != nil {
				t.Fatalf("seminit status --json: %v\n%s\n%s", err, res.stdout, res.stderr)
			}
			c := st.Controller
			return c != nil && strings.Contains(c.By, want) && c.Leader == name+"-adapt" && c.Leading != nil && *c.Leading
		})
		stop()
		wg.Wait()
		// A controller prints a resize once it has returned, after the new
		// count was written and its tokens issued, so the one under way when
		// the leader was killed, and the one under way now, admitted callers
		// unprinted: the counts read from the broker after each controller
		// ended (held, and last) stand for them.
		if err := other.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		other.wait(30 * time.Second)
		last := count()
		printed := 1
		for _, c := range ctls {
			for _, ev := range adaptEvents(t, c) {
				if ev.Event == "failed" {
					t.Logf("a resize failed: %+v", ev)
				}
				printed = max(printed, ev.To, ev.Permits)
			}
		}
		most := max(printed, held, last)
		t.Logf("largest count printed %d, read after the kill %d, at the end %d; %d callers at most", printed, held, last, meter.Max())
		if last < 2 || last > 8 {
			t.Errorf("after the failover the count is %d; want it near the capacity %d", last, capacity)
		}
		if m := meter.Max(); m > most {
			t.Errorf("%d callers held at once, above the largest count set, %d (read after the kill: %d; at the end: %d)\nA: %s\nB: %s",
				m, most, held, last, ctls[0].stdout.String(), ctls[1].stdout.String())
		}
	})
}

// recordKeeper: a controller that begins to lead records itself and keeps
// the changes the last leader recorded, then adds its own, the latest
// MaxChanges.
func TestRecordKeeperKeepsChanges(t *testing.T) {
	t.Parallel()
	forEachBroker(t, func(t *testing.T, b broker) {
		t.Parallel()
		name := uniqueName(t)
		b.mustInit(t, name, 2)
		t.Cleanup(func() { b.seminit(t, "delete", "--name", name, "--force") })
		s := b.openReporting(t, name, adaptive.NewWindow(name)).(controlRecorder)
		ctx := t.Context()
		record := func(k *recordKeeper) {
			t.Helper()
			if err := k.write(ctx); err != nil {
				t.Fatal(err)
			}
		}
		base := adaptive.Record{Leader: name + "-adapt", Min: 1, Max: 16, Algorithm: "aimd"}
		a := newRecordKeeper(s, base, 10*time.Second, slog.New(slog.DiscardHandler))
		a.led(time.Now())
		for n := 2; n < 6; n++ {
			a.changed(adaptive.Change{At: time.Now(), From: n, To: n + 1, Why: "a"})
		}
		record(a)
		next := newRecordKeeper(s, base, 10*time.Second, slog.New(slog.DiscardHandler))
		next.led(time.Now())
		for n := 6; n > 1; n-- {
			next.changed(adaptive.Change{At: time.Now(), From: n, To: n - 1, Why: "b"})
		}
		record(next)
		r, ok, err := s.ControllerRecord(ctx)
		if err != nil || !ok {
			t.Fatalf("ControllerRecord: %v (found %v)", err, ok)
		}
		var got []string
		for _, c := range r.Changes {
			got = append(got, fmt.Sprintf("%s%d>%d", c.Why, c.From, c.To))
		}
		// The first leader's last 3 of 4, then the next one's 5.
		if want := "a3>4 a4>5 a5>6 b6>5 b5>4 b4>3 b3>2 b2>1"; strings.Join(got, " ") != want {
			t.Errorf("the record's changes are %q; want %q", strings.Join(got, " "), want)
		}
		if !strings.Contains(r.By, fmt.Sprintf("(pid %d)", os.Getpid())) || r.Leader != name+"-adapt" || r.Algorithm != "aimd" {
			t.Errorf("the record is %+v", r)
		}
	})
}

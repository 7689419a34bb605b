package natssem_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/faultproxy"
	"github.com/tokensem/tokensem/internal/semtest"
	"github.com/tokensem/tokensem/natssem"
)

// The seams: where a semaphore's life ends and another of the same name
// begins (DESIGN.md, guarantee 5). A life is an identity that admission
// checks, a slot's fence never goes back for a name, and a delete that
// lost its admin lock changes nothing.

// seamTrust is how long a client trusts a configuration it read (natssem's
// configTTL, 2 s) plus room: a client that read the generation or the
// configuration longer ago than this reads it again before admitting.
const seamTrust = 2*time.Second + 300*time.Millisecond

var seamSeq atomic.Int64

// seamName returns a name no earlier run in this process used (the tests
// share the package's server, and -count runs them again).
func seamName(prefix string) string { return fmt.Sprintf("%s-%d", prefix, seamSeq.Add(1)) }

// holderWatch records every permit of one semaphore of a single permit that
// the test acquires, and fails the test if two of them are ever valid at
// once: checked when each is acquired, and every few milliseconds between.
type holderWatch struct {
	t    *testing.T
	mu   sync.Mutex
	held []watched
	bad  string // the first time two permits were valid at once
	seen int    // how many checks found two
	stop chan struct{}
	done chan struct{}
}

type watched struct {
	who string
	p   *natssem.Permit
	at  time.Time
}

func newHolderWatch(t *testing.T) *holderWatch {
	w := &holderWatch{t: t, stop: make(chan struct{}), done: make(chan struct{})}
	go w.poll()
	t.Cleanup(func() {
		w.close()
		for _, h := range w.held {
			_ = h.p.Release(context.WithoutCancel(t.Context())) // stops its renewals, whatever its state
		}
	})
	return w
}

// valid reports whether p believes it holds its permit.
func valid(p *natssem.Permit) bool {
	select {
	case <-p.Done():
		return false
	default:
		return p.Err() == nil
	}
}

func (w *holderWatch) add(who string, p *natssem.Permit) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.held = append(w.held, watched{who: who, p: p, at: time.Now()})
	w.checkLocked("at the acquisition of " + who)
}

func (w *holderWatch) checkLocked(when string) {
	var live []watched
	for _, h := range w.held {
		if valid(h.p) {
			live = append(live, h)
		}
	}
	if len(live) < 2 {
		return
	}
	if w.seen++; w.seen > 1 {
		return
	}
	var desc []string
	for _, h := range live {
		desc = append(desc, fmt.Sprintf("%s (slot %d, fence %d, acquired %v ago, believes for %v more)",
			h.who, h.p.Token().Index, h.p.Fence(), time.Since(h.at).Round(time.Millisecond),
			time.Until(h.p.Deadline()).Round(time.Millisecond)))
	}
	w.bad = fmt.Sprintf("%s: %d valid permits of a semaphore of 1: %s", when, len(live), strings.Join(desc, "; "))
}

func (w *holderWatch) poll() {
	defer close(w.done)
	for {
		select {
		case <-w.stop:
			return
		case <-time.After(2 * time.Millisecond):
		}
		w.mu.Lock()
		w.checkLocked("while polling")
		w.mu.Unlock()
	}
}

func (w *holderWatch) close() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

// verdict stops the watch and fails the test if two permits were ever
// valid at once.
func (w *holderWatch) verdict() {
	w.t.Helper()
	w.close()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.seen > 0 {
		w.t.Errorf("two valid holders at once (found by %d checks), first %s", w.seen, w.bad)
	}
}

// acquireSeam acquires a permit of s within a generous bound.
func acquireSeam(t *testing.T, s *natssem.Semaphore, who string) *natssem.Permit {
	t.Helper()
	p, err := s.Acquire(semtest.Context(t, 30*time.Second))
	if err != nil {
		t.Fatalf("%s: Acquire: %v", who, err)
	}
	return p.(*natssem.Permit)
}

// oneHolderInTheNewLife is the check of the new life of a semaphore of one
// permit with lease newLease: a, a handle opened in the earlier life,
// acquires, and its permit must carry the new lease; b, a client of the new
// life, waits. The two must never both hold a valid permit: b gets the
// permit once a releases it, not by taking over a slot whose holder still
// believes it holds it. b is given the chance a stale lease would give it
// (the new life's consumer redelivers a token a lease after the last
// in-progress ack, and a holder of the new lease renews a third of a lease
// apart), then a releases.
func oneHolderInTheNewLife(t *testing.T, a, b *natssem.Semaphore, newLease time.Duration) {
	t.Helper()
	ctx := semtest.Context(t, time.Minute)
	w := newHolderWatch(t)

	pa := acquireSeam(t, a, "a, the handle opened in the earlier life")
	acquired := time.Now()
	w.add("a (handle opened in the earlier life)", pa)
	if over := pa.Deadline().Sub(acquired.Add(newLease)); over > 0 {
		t.Errorf("a's permit, acquired in a life whose lease is %v, believes it holds until %v after its acquisition "+
			"(%v past the lease): it holds by the earlier life's lease", newLease,
			pa.Deadline().Sub(acquired).Round(time.Millisecond), over.Round(time.Millisecond))
	}

	type result struct {
		p   *natssem.Permit
		err error
	}
	got := make(chan result, 1)
	go func() {
		p, err := b.Acquire(ctx)
		if err != nil {
			got <- result{err: err}
			return
		}
		got <- result{p: p.(*natssem.Permit)}
	}()
	var pb *natssem.Permit
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("b, the client of the new life: Acquire while a held: %v", r.err)
		}
		pb = r.p
		w.add("b (client of the new life)", pb)
		t.Logf("b acquired %v after a, a valid: %v", time.Since(acquired).Round(time.Millisecond), valid(pa))
	case <-time.After(time.Until(acquired.Add(2*newLease + time.Second))):
	}
	if pb == nil {
		if err := pa.Release(ctx); err != nil {
			t.Errorf("a's release: %v", err)
		}
		r := <-got
		if r.err != nil {
			t.Fatalf("b, the client of the new life: Acquire after a released: %v", r.err)
		}
		pb = r.p
		w.add("b (client of the new life)", pb)
	}
	if err := pb.Release(ctx); err != nil {
		t.Errorf("b's release: %v", err)
	}
	w.verdict()
}

// TestSeamRelifeWithAnotherLease: a semaphore of one permit is deleted and
// made again with another lease while a client keeps a handle of its
// earlier life open. The handle acquires within its cached configuration's
// trust window; its permit must carry the new life's lease, and it and a
// client of the new life must never both hold a valid permit. Also for a
// key of a group, where the handle trusts its configuration by the group's
// generation, read by an acquire and release just before the Delete.
func TestSeamRelifeWithAnotherLease(t *testing.T) {
	t.Parallel()
	const oldLease, newLease = 30 * time.Second, 3 * time.Second
	for _, tc := range []struct {
		name  string
		group bool
	}{
		{name: "lone"},
		{name: "key of a group", group: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := semtest.Context(t, 2*time.Minute)
			name := seamName("seam-relife")
			var opts []natssem.Option
			if tc.group {
				opts = append(opts, natssem.WithGroup(seamName("seam-relife-group")))
			}
			maker := connect(t, srv.Addr().String())
			first, err := natssem.Init(ctx, maker, name, 1, append(opts, natssem.WithLease(oldLease))...)
			if err != nil {
				t.Fatal(err)
			}
			_ = first.Close()

			a, err := natssem.Open(ctx, connect(t, srv.Addr().String()), name, opts...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = a.Close() })
			trusted := time.Now() // a read the configuration
			if tc.group {
				// Past configTTL a key's configuration is trusted by the
				// generation: the cycle reads it, as a busy client does.
				time.Sleep(seamTrust)
				trusted = time.Now()
				p := acquireSeam(t, a, "a in the earlier life")
				if err := p.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}

			if err := natssem.Delete(ctx, maker, name, opts...); err != nil {
				t.Fatalf("delete: %v", err)
			}
			second, err := natssem.Init(ctx, maker, name, 1, append(opts, natssem.WithLease(newLease))...)
			if err != nil {
				t.Fatalf("init of the new life: %v", err)
			}
			_ = second.Close()
			t.Logf("the new life exists %v after a last read its configuration or generation", time.Since(trusted).Round(time.Millisecond))

			b, err := natssem.Open(ctx, connect(t, srv.Addr().String()), name, opts...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = b.Close() })
			oneHolderInTheNewLife(t, a, b, newLease)
		})
	}
}

// TestSeamGroupRemovedByHand: an operator removes a group's stream and
// bucket with plain JetStream calls while client a has a key of it open
// and has used it; Init then makes the key again with another count and
// lease. The generation of the new bucket reads as that of the old one
// (never bumped in either), but a must admit by the new life's count and
// lease: its permit carries the new lease, it counts the new permits, and
// it and a client of the new life never both hold a valid permit. a
// acquires after its trust window (configTTL) has passed, so it must read
// something of the new life before it admits.
func TestSeamGroupRemovedByHand(t *testing.T) {
	t.Parallel()
	const oldLease, newLease = 30 * time.Second, 3 * time.Second
	ctx := semtest.Context(t, 2*time.Minute)
	group, key := seamName("seam-byhand"), "k"
	in := natssem.WithGroup(group)
	maker := connect(t, srv.Addr().String())
	first, err := natssem.Init(ctx, maker, key, 2, in, natssem.WithLease(oldLease))
	if err != nil {
		t.Fatal(err)
	}
	_ = first.Close()

	a, err := natssem.Open(ctx, connect(t, srv.Addr().String()), key, in)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	time.Sleep(seamTrust) // past configTTL: the cycle reads the generation
	read := time.Now()
	p := acquireSeam(t, a, "a in the earlier life")
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}

	js, err := jetstream.New(connect(t, srv.Addr().String()))
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(ctx, natssem.ResourcesOf("", group).Stream); err != nil {
		t.Fatalf("operator: delete the group's stream: %v", err)
	}
	if err := js.DeleteKeyValue(ctx, natssem.ResourcesOf("", group).Bucket); err != nil {
		t.Fatalf("operator: delete the group's bucket: %v", err)
	}
	second, err := natssem.Init(ctx, connect(t, srv.Addr().String()), key, 1, in, natssem.WithLease(newLease))
	if err != nil {
		t.Fatalf("init of the new life: %v", err)
	}
	_ = second.Close()
	b, err := natssem.Open(ctx, connect(t, srv.Addr().String()), key, in)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })

	// Past a's trust window: whatever a admits by now, it read after the
	// new life was made.
	time.Sleep(time.Until(read.Add(seamTrust)))
	oneHolderInTheNewLife(t, a, b, newLease)
	if got := a.Permits(); got != 1 {
		t.Errorf("a counts %d permits after acquiring in a life of 1", got)
	}
}

// TestSeamFencesNeverGoBack: a slot's fence never goes back for a name. Ten
// acquire and release cycles in one life, then the life ends and Init makes
// the name again: the first fence of the new life is greater than every
// fence of the earlier one.
func TestSeamFencesNeverGoBack(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		group bool
		lease time.Duration
		// end ends the life whose handle is s, and returns the fences of
		// permits it acquired meanwhile.
		end func(t *testing.T, ctx context.Context, nc *nats.Conn, s *natssem.Semaphore, opts []natssem.Option) []uint64
	}{
		{
			name: "delete",
			end: func(t *testing.T, ctx context.Context, nc *nats.Conn, s *natssem.Semaphore, opts []natssem.Option) []uint64 {
				if err := natssem.Delete(ctx, nc, s.Name(), opts...); err != nil {
					t.Fatalf("delete: %v", err)
				}
				return nil
			},
		},
		{
			name:  "force delete of a held semaphore",
			lease: 2 * time.Second,
			end: func(t *testing.T, ctx context.Context, nc *nats.Conn, s *natssem.Semaphore, opts []natssem.Option) []uint64 {
				p := acquireSeam(t, s, "the holder the force delete removes")
				defer func() { _ = p.Release(ctx) }()
				if err := natssem.ForceDelete(ctx, nc, s.Name(), opts...); err != nil {
					t.Fatalf("force delete: %v", err)
				}
				return []uint64{p.Fence()}
			},
		},
		{
			name:  "key of a group whose stream and bucket were removed by hand",
			group: true,
			end: func(t *testing.T, ctx context.Context, nc *nats.Conn, s *natssem.Semaphore, opts []natssem.Option) []uint64 {
				js, err := jetstream.New(nc)
				if err != nil {
					t.Fatal(err)
				}
				group := strings.TrimPrefix(s.Name(), "k-")
				if err := js.DeleteStream(ctx, natssem.ResourcesOf("", group).Stream); err != nil {
					t.Fatalf("operator: delete the group's stream: %v", err)
				}
				if err := js.DeleteKeyValue(ctx, natssem.ResourcesOf("", group).Bucket); err != nil {
					t.Fatalf("operator: delete the group's bucket: %v", err)
				}
				return nil
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := semtest.Context(t, time.Minute)
			name := seamName("seam-fence")
			var opts []natssem.Option
			if tc.group {
				// The key is named after its group, for end to find it.
				group := name
				name = "k-" + group
				opts = append(opts, natssem.WithGroup(group))
			}
			if tc.lease > 0 {
				opts = append(opts, natssem.WithLease(tc.lease))
			}
			nc := connect(t, srv.Addr().String())
			s, err := natssem.Init(ctx, nc, name, 1, opts...)
			if err != nil {
				t.Fatal(err)
			}
			var old []uint64
			for range 10 {
				p := acquireSeam(t, s, "earlier life")
				old = append(old, p.Fence())
				if err := p.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			old = append(old, tc.end(t, ctx, nc, s, opts)...)
			_ = s.Close()
			oldMax := old[0]
			for _, f := range old {
				oldMax = max(oldMax, f)
			}

			again, err := natssem.Init(ctx, connect(t, srv.Addr().String()), name, 1, opts...)
			if err != nil {
				t.Fatalf("init of the new life: %v", err)
			}
			t.Cleanup(func() { _ = again.Close() })
			p := acquireSeam(t, again, "new life")
			fence := p.Fence()
			if err := p.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if fence <= oldMax {
				t.Errorf("the first fence of the new life is %d, not above the earlier life's fences %v (max %d)", fence, old, oldMax)
			}
		})
	}
}

// The frozen deleter: a child process (this test binary, started with
// seamsWorkerEnv set) that runs one ForceDelete and reports its result.
const (
	seamsWorkerEnv = "TOKENSEM_SEAMS_WORKER" // the worker's job: "forcedelete"
	seamsURLEnv    = "TOKENSEM_SEAMS_URL"
	seamsNameEnv   = "TOKENSEM_SEAMS_NAME"
	// seamsSleeping is what ForceDelete logs before it waits for the
	// force-deleted holders' leases to run out.
	seamsSleeping = "waiting for the leases of the force-deleted permits to run out"
)

// A test binary started with seamsWorkerEnv runs the worker instead of its
// tests (before TestMain: the worker needs no server of its own).
func init() {
	if os.Getenv(seamsWorkerEnv) == "forcedelete" {
		os.Exit(forceDeleteWorker())
	}
}

// forceDeleteWorker force-deletes the semaphore named in the environment,
// logging to stderr, and prints ForceDelete's result on stdout.
func forceDeleteWorker() int {
	nc, err := nats.Connect(os.Getenv(seamsURLEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	err = natssem.ForceDelete(ctx, nc, os.Getenv(seamsNameEnv), natssem.WithLogger(log), natssem.WithHolderName("frozen-deleter"))
	fmt.Printf("ForceDelete: %v\n", err)
	return 0
}

// lineWatch is a child's stderr: it keeps the output and closes seen when
// a line containing marker arrives.
type lineWatch struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	marker string
	seen   chan struct{}
	once   sync.Once
}

func (l *lineWatch) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(b)
	if strings.Contains(l.buf.String(), l.marker) {
		l.once.Do(func() { close(l.seen) })
	}
	return len(b), nil
}

func (l *lineWatch) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// TestSeamFrozenDeleteKeepsItsHands: a ForceDelete frozen (SIGSTOP) while
// it holds the admin lock, after it closed the held slot and while it waits
// for that holder's lease, loses the lock: an Init of the name takes it
// over once it has not been renewed for the lock's TTL (15 s), finishes the
// delete and makes a new life, and a client holds the new life's permit.
// When the deleter resumes (SIGCONT) it must not remove the new life: after
// it exits the semaphore still exists, Status works, a new client can open
// it, and the holder's permit stays valid through a renewal. The deleter
// runs in a child process (this binary, see forceDeleteWorker) reaching the
// server through a proxy, which holds its traffic for a moment as it
// resumes, so that the test does not depend on which of its goroutines the
// scheduler runs first.
func TestSeamFrozenDeleteKeepsItsHands(t *testing.T) {
	t.Parallel()
	const lease = 3 * time.Second
	ctx := semtest.Context(t, 3*time.Minute)
	name := seamName("seam-frozen")
	addr := srv.Addr().String()
	old, err := natssem.Init(ctx, connect(t, addr), name, 1, natssem.WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = old.Close() })
	w := newHolderWatch(t)
	oldHolder := acquireSeam(t, old, "holder of the earlier life")
	w.add("holder of the earlier life", oldHolder)

	stderr := &lineWatch{marker: seamsSleeping, seen: make(chan struct{})}
	var stdout bytes.Buffer
	child := exec.Command(os.Args[0], "-test.run=^$")
	// The deleter reaches the server through a proxy that holds its
	// traffic at the instant it resumes (see below).
	px, err := faultproxy.New(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = px.Close() })
	child.Env = append(os.Environ(), seamsWorkerEnv+"=forcedelete", seamsURLEnv+"=nats://"+px.Addr(), seamsNameEnv+"="+name)
	child.Stdout, child.Stderr = &stdout, stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{}) // closed when the child has exited
	var exitErr error
	go func() { exitErr = child.Wait(); close(exited) }()
	stopped := false
	t.Cleanup(func() {
		select {
		case <-exited:
			return
		default:
		}
		if stopped {
			_ = child.Process.Signal(syscall.SIGCONT)
		}
		_ = child.Process.Kill()
		<-exited
	})

	// The window: the deleter holds the lock and has closed the held slot
	// (its record reads {"del":true}); it is about to sleep until the
	// holder's lease has run out, and then removes the stream and bucket.
	js, err := jetstream.New(connect(t, addr))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, natssem.ResourcesOf(name, "").Bucket)
	if err != nil {
		t.Fatal(err)
	}
	for {
		e, err := kv.Get(ctx, "slot.0")
		var rec struct {
			Deleted bool `json:"del"`
		}
		if err == nil && json.Unmarshal(e.Value(), &rec) == nil && rec.Deleted {
			break
		}
		select {
		case <-exited:
			t.Fatalf("the deleter exited (%v) before it closed the slot:\n%s%s", exitErr, stdout.String(), stderr)
		case <-ctx.Done():
			t.Fatalf("the deleter never closed the held slot:\n%s", stderr)
		case <-time.After(2 * time.Millisecond):
		}
	}
	select {
	case <-stderr.seen:
		// A few instructions before its sleep: let it get there (it sleeps
		// a lease; its lock's next renewal is due a third of 15 s after
		// it took the lock).
		time.Sleep(lease / 10)
		t.Logf("freezing the deleter: it closed the held slot and logged %q", seamsSleeping)
	case <-time.After(lease):
		t.Logf("the deleter did not log %q; freezing it on the closed slot alone", seamsSleeping)
	}
	if err := child.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped = true
	frozen := time.Now()
	if e, err := kv.Get(ctx, "lock"); err != nil || !strings.Contains(string(e.Value()), "frozen-deleter") {
		t.Fatalf("the frozen deleter does not hold the admin lock: %v", err)
	}

	// Init waits for the lock, takes it over, finishes the delete and makes
	// the new life.
	s, err := natssem.Init(ctx, connect(t, addr), name, 1, natssem.WithLease(lease))
	if err != nil {
		t.Fatalf("init while the deleter is frozen: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	t.Logf("the new life exists %v after the deleter froze", time.Since(frozen).Round(time.Millisecond))
	holder := acquireSeam(t, s, "holder of the new life")
	w.add("holder of the new life", holder)

	// On resume the deleter's sleep has ended and its lock renewal is
	// overdue: both run at once. Its network is held for a moment (not
	// long enough for a request to time out), so that the renewal's
	// answer, which tells it the lock was taken over, cannot reach it
	// within a loopback round trip: what it does before it hears from the
	// server decides, not the order the scheduler picks.
	px.Pause()
	if err := child.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopped = false
	time.Sleep(500 * time.Millisecond)
	px.Resume()
	select {
	case <-exited:
		if exitErr != nil {
			t.Errorf("the deleter: %v", exitErr)
		}
	case <-time.After(time.Minute):
		t.Fatalf("the deleter did not exit within a minute of resuming:\n%s", stderr)
	}
	t.Logf("the resumed deleter says %s", strings.TrimSpace(stdout.String()))

	st, err := s.Status(ctx)
	switch {
	case errors.Is(err, tokensem.ErrNotInitialized):
		t.Errorf("the resumed deleter removed the new life: Status: %v", err)
	case err != nil:
		t.Errorf("status of the new life after the deleter resumed: %v", err)
	case st.Tokens != 1 || st.Held != 1:
		t.Errorf("status of the new life after the deleter resumed: %+v, want its one token held", st)
	}
	if o, err := natssem.Open(ctx, connect(t, addr), name); err != nil {
		t.Errorf("open of the new life after the deleter resumed: %v", err)
	} else {
		_ = o.Close()
	}
	// The holder keeps its permit through a renewal (a third of a lease):
	// its deadline moves on, or it loses the permit.
	before := holder.Deadline()
	for valid(holder) && !holder.Deadline().After(before) && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}
	if !valid(holder) {
		t.Errorf("the new life's holder lost its permit after the deleter resumed: %v", holder.Err())
	} else if err := holder.Release(ctx); err != nil {
		t.Errorf("the new life's holder: release: %v", err)
	}
	w.verdict()
	t.Logf("the deleter's log:\n%s", stderr)
}

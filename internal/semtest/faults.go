package semtest

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/faultproxy"
)

// The fault tests: a holder whose network freezes, a release that arrives
// after the lease, a crashed holder, and Do's context when the permit is
// lost. Each runs a client through a fault proxy or drops its session.

// proxied opens a client of name through a fault proxy.
func proxied(t *testing.T, b Backend, name string, o Options) (*faultproxy.Proxy, tokensem.Semaphore) {
	t.Helper()
	px, err := faultproxy.New(b.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = px.Close() })
	return px, mustOpen(t, b, px.Addr(), name, o)
}

// testSilentHolder freezes a holder's network. It must learn of the loss
// (Done) before a waiter can hold its slot, and the waiter must get it.
func testSilentHolder(t *testing.T, b Backend) {
	const lease = 2 * time.Second
	name := uniqueName(t)
	direct := mustInit(t, b, name, 1, Options{Lease: lease})
	px, a := proxied(t, b, name, Options{})
	pa := mustAcquire(t, a, 5*time.Second)

	start := time.Now()
	px.Pause()
	var lostAt atomic.Int64
	go func() { <-pa.Done(); lostAt.Store(time.Now().UnixNano()) }()
	pb, err := direct.Acquire(Context(t, 4*lease+10*time.Second))
	gotAt := time.Now()
	if err != nil {
		t.Fatalf("waiter never got the silent holder's permit: %v", err)
	}
	if lostAt.Load() == 0 || lostAt.Load() > gotAt.UnixNano() {
		t.Fatalf("holder learned of the loss at %v, after the waiter acquired at %v",
			time.Unix(0, lostAt.Load()).Sub(start), gotAt.Sub(start))
	}
	if !errors.Is(pa.Err(), tokensem.ErrLeaseLost) {
		t.Fatalf("lost permit Err = %v, want ErrLeaseLost", pa.Err())
	}
	if pb.Fence() <= pa.Fence() {
		t.Fatalf("new holder's fence %d not above the old %d", pb.Fence(), pa.Fence())
	}
	t.Logf("silent holder lost its permit after %v; the waiter held it after %v",
		time.Unix(0, lostAt.Load()).Sub(start), gotAt.Sub(start))
	px.Resume()
	mustRelease(t, pb)
}

// testStaleRelease: A's network freezes while A is releasing; A's lease
// expires, B takes the slot; then A's delayed release reaches the broker.
// It must not free B's slot or hand the token to a third client.
func testStaleRelease(t *testing.T, b Backend) {
	const lease = 2 * time.Second
	name := uniqueName(t)
	direct := mustInit(t, b, name, 1, Options{Lease: lease})
	third := mustOpen(t, b, b.Addr, name, Options{})
	px, a := proxied(t, b, name, Options{})
	pa := mustAcquire(t, a, 5*time.Second)

	px.Pause()
	released := make(chan error, 1)
	go func() { released <- pa.Release(context.Background()) }()
	pb, err := direct.Acquire(Context(t, 4*lease+10*time.Second))
	if err != nil {
		t.Fatalf("B never got the stale holder's permit: %v", err)
	}
	// C queues up, then A's stale release is let through.
	cCtx, cCancel := context.WithCancel(t.Context())
	cGot := make(chan tokensem.Permit, 1)
	go func() {
		if p, err := third.Acquire(cCtx); err == nil {
			cGot <- p
		}
	}()
	eventually(t, 10*time.Second, "C queued", func() bool { return status(t, direct).Waiting >= 1 })
	px.Resume()
	if err := <-released; !errors.Is(err, tokensem.ErrLeaseLost) {
		t.Fatalf("stale Release: err = %v, want ErrLeaseLost", err)
	}
	// Give a wrongly handed-back token time to reach C.
	select {
	case p := <-cGot:
		t.Fatalf("C acquired slot %d while B holds the only permit", p.Token().Index)
	case <-time.After(lease / 2):
	}
	if pb.Err() != nil {
		t.Fatalf("B lost its permit to A's stale release: %v", pb.Err())
	}
	mustRelease(t, pb)
	var pc tokensem.Permit
	select {
	case pc = <-cGot:
	case <-time.After(10 * time.Second):
		t.Fatal("C never got the permit after B released: a token was lost")
	}
	cCancel()
	mustRelease(t, pc)
	settled(t, direct, "after the stale release", func(st tokensem.Status) bool {
		return st.Tokens == 1 && st.Healthy
	})
}

// testCrashedHolder drops a holder's session abruptly; its permit must come
// back to a waiter.
func testCrashedHolder(t *testing.T, b Backend) {
	const lease = 2 * time.Second
	name := uniqueName(t)
	direct := mustInit(t, b, name, 1, Options{Lease: lease})
	a, err := b.Open(t, b.Addr, name, Options{})
	if err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, a, 5*time.Second)
	start := time.Now()
	b.Crash(t, a)
	p := mustAcquire(t, direct, 4*lease+10*time.Second)
	t.Logf("crashed holder's permit came back after %v (lease %v)", time.Since(start), lease)
	mustRelease(t, p)
}

func testDoCancelsOnLoss(t *testing.T, b Backend) {
	const lease = 2 * time.Second
	name := uniqueName(t)
	mustInit(t, b, name, 1, Options{Lease: lease})
	px, a := proxied(t, b, name, Options{})
	var cause error
	err := tokensem.Do(Context(t, 30*time.Second), a, func(ctx context.Context) error {
		px.Pause()
		<-ctx.Done()
		cause = context.Cause(ctx)
		px.Resume()
		return ctx.Err()
	})
	if !errors.Is(err, tokensem.ErrLeaseLost) || !errors.Is(cause, tokensem.ErrLeaseLost) {
		t.Fatalf("Do after a loss: err = %v, ctx cause = %v; want ErrLeaseLost in both", err, cause)
	}
	ok := tokensem.Do(Context(t, 30*time.Second), a, func(ctx context.Context) error { return nil })
	if ok != nil {
		t.Fatalf("Do after recovery: %v", ok)
	}
}

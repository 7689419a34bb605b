package natssem

import (
	"strconv"
	"testing"
	"time"
)

// A client whose configuration is older than configTTL admits a token by
// a fresh read of it: the read starts beside the pull (Cache.Prefetch) and
// the admission waits for it. Here another client shrinks the semaphore
// from 2 permits to 1 while this one sits idle with its count of 2, then
// the retired slot's token turns up again (as a token on its way to a
// waiter when the shrink removed the ready ones would): by its cached
// count this client would admit it and hold two permits.
func TestIdleClientAdmitsByTheNewCount(t *testing.T) {
	srv := startServer(t)
	ctx := testContext(t)
	const name = "stale-admit"
	a, err := Init(ctx, dial(t, srv), name, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Open(ctx, dial(t, srv), name)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := a.Resize(ctx, 1); err != nil {
		t.Fatal(err)
	}
	time.Sleep(configTTL + 100*time.Millisecond)
	admitsByTheNewCount(t, b)
}

// Semaphores made and closed on a long-lived connection (per-key
// semaphores that come and go: semgroup's idle expiry) leave no
// subscription behind: Init's asynchronous token publishes used to keep a
// reply subscription, a status listener and a goroutine per semaphore
// until the connection closed.
func TestClosedSemaphoresLeaveNoSubscriptions(t *testing.T) {
	srv := startServer(t)
	ctx := testContext(t)
	nc := dial(t, srv)
	// The connection's first request subscribes its shared reply inbox,
	// once for the connection's life.
	_, _ = nc.Request("leak.warm-up", nil, time.Second)
	base := nc.NumSubscriptions()
	for i := range 5 {
		for _, opts := range [][]Option{nil, {WithGroup("leak")}} {
			s, err := Init(ctx, nc, "leak-"+strconv.Itoa(i), 2, opts...)
			if err != nil {
				t.Fatal(err)
			}
			p, err := s.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Release(ctx); err != nil {
				t.Fatal(err)
			}
			q, err := s.TryAcquire(ctx) // waits for the release's confirmation
			if err != nil {
				t.Fatal(err)
			}
			if err := q.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A closed waiter drains its inbox, which ends after a round trip.
	deadline := time.Now().Add(5 * time.Second)
	for nc.NumSubscriptions() != base && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := nc.NumSubscriptions(); n != base {
		t.Fatalf("%d subscriptions on the connection after 10 semaphores were made and closed, %d before", n, base)
	}
}

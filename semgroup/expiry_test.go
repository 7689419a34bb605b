package semgroup_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/amqpsem"
	"github.com/tokensem/tokensem/internal/semtest"
	"github.com/tokensem/tokensem/natssem"
	"github.com/tokensem/tokensem/semgroup"
)

// lifecycle is what the idle expiry tests need of a broker: a way to
// create (a fresh client each call, as a replica would be), to delete,
// and to ask whether a semaphore exists.
type lifecycle struct {
	init   func(t *testing.T) semgroup.InitFunc
	del    func(t *testing.T) semgroup.DeleteFunc
	exists func(t *testing.T, name string) bool
}

var lifecycles = []struct {
	name string
	lc   lifecycle
}{
	{"nats", lifecycle{init: natsInit, del: natsDelete, exists: natsExists}},
	{"nats-group", lifecycle{init: natsGroupInit, del: natsGroupDelete, exists: natsGroupExists}},
	{"amqp", lifecycle{init: amqpInit, del: amqpDelete, exists: amqpExists}},
}

func natsConn(t *testing.T) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func natsDelete(t *testing.T) semgroup.DeleteFunc {
	nc := natsConn(t)
	return func(ctx context.Context, name string) error { return natssem.Delete(ctx, nc, name) }
}

func natsGroupDelete(t *testing.T) semgroup.DeleteFunc {
	nc := natsConn(t)
	return func(ctx context.Context, name string) error { return natssem.Delete(ctx, nc, name, inGroup) }
}

func natsGroupExists(t *testing.T, name string) bool {
	_, err := natssem.Open(bounded(t), natsConn(t), name, inGroup)
	return exists(t, err)
}

func natsExists(t *testing.T, name string) bool {
	_, err := natssem.Open(bounded(t), natsConn(t), name)
	return exists(t, err)
}

func amqpConn(t *testing.T) *amqpsem.Conn {
	t.Helper()
	c, err := amqpsem.Dial(bounded(t), brokers.RabbitFor(t).URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func amqpDelete(t *testing.T) semgroup.DeleteFunc {
	c := amqpConn(t)
	return func(ctx context.Context, name string) error { return amqpsem.Delete(ctx, c, name) }
}

func amqpExists(t *testing.T, name string) bool {
	s, err := amqpsem.Open(bounded(t), amqpConn(t), name)
	if err == nil {
		_ = s.Close()
	}
	return exists(t, err)
}

func exists(t *testing.T, err error) bool {
	t.Helper()
	switch {
	case err == nil:
		return true
	case errors.Is(err, tokensem.ErrNotInitialized):
		return false
	}
	t.Fatalf("open: %v", err)
	return false
}

// countDeletes wraps a DeleteFunc to count its outcomes. Once stopped, it
// deletes nothing more.
type countDeletes struct {
	del           semgroup.DeleteFunc
	deleted, held atomic.Int64

	mu      sync.Mutex // held for each delete
	stopped bool
}

// stop waits for a delete under way to end and makes later ones fail
// without deleting: the Group's expiry goes on, but changes nothing.
func (c *countDeletes) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopped = true
}

func (c *countDeletes) Delete(ctx context.Context, name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return errors.New("the test stopped the deletes")
	}
	err := c.del(ctx, name)
	switch {
	case err == nil:
		c.deleted.Add(1)
	case errors.Is(err, tokensem.ErrHeld):
		c.held.Add(1)
	}
	return err
}

// TestIdleExpiry: a key unused for the expiry is deleted from the broker,
// cached or evicted; a key whose permit is held is not; a key used again
// after its expiry is created again.
func TestIdleExpiry(t *testing.T) {
	for _, b := range lifecycles {
		t.Run(b.name, func(t *testing.T) {
			const idle = 300 * time.Millisecond
			prefix := uniquePrefix()
			g := newGroup(t, b.lc.init(t), 1, semgroup.WithPrefix(prefix), semgroup.WithMaxSize(2),
				semgroup.WithIdleExpiry(idle, b.lc.del(t)))
			ctx := bounded(t)
			noop := func(context.Context) error { return nil }
			for _, key := range []string{"a", "b", "c"} { // c evicts a, and "held" evicts b
				if err := g.Do(ctx, key, noop); err != nil {
					t.Fatal(err)
				}
			}
			p, err := g.Acquire(ctx, "held")
			if err != nil {
				t.Fatal(err)
			}
			for _, key := range []string{"a", "b", "c"} {
				waitFor(t, key+" deleted after its idle period", func() bool { return !b.lc.exists(t, prefix+key) })
			}
			time.Sleep(2 * idle)
			if !b.lc.exists(t, prefix+"held") {
				t.Fatal("the key whose permit is held was deleted")
			}
			if err := p.Release(ctx); err != nil {
				t.Fatalf("release: %v", err)
			}
			waitFor(t, "held deleted after its release and idle period", func() bool { return !b.lc.exists(t, prefix+"held") })

			if err := g.Do(ctx, "a", noop); err != nil {
				t.Fatalf("using a key again after its expiry: %v", err)
			}
			st, err := g.Status(ctx, "a")
			if err != nil || st.Permits != 1 || st.Tokens != 1 || !st.Healthy {
				t.Fatalf("a created again: %+v, %v", st, err)
			}
		})
	}
}

// TestIdleExpiryAcrossReplicas: replica A used a key once and expires it;
// replica B keeps using it. A's delete is refused while B holds a permit,
// and succeeds between B's holds; B's calls never fail (its Group opens the
// deleted key again) and never hold more than the permits at once.
func TestIdleExpiryAcrossReplicas(t *testing.T) {
	for _, b := range lifecycles {
		t.Run(b.name, func(t *testing.T) {
			const idle, permits = 50 * time.Millisecond, 2
			prefix := uniquePrefix()
			cd := &countDeletes{del: b.lc.del(t)}
			a := newGroup(t, b.lc.init(t), permits, semgroup.WithPrefix(prefix), semgroup.WithIdleExpiry(idle, cd.Delete))
			replicaB := newGroup(t, b.lc.init(t), permits, semgroup.WithPrefix(prefix))
			ctx := bounded(t)

			var m semtest.Meter
			hold := func(d time.Duration) func(context.Context) error {
				return func(context.Context) error {
					m.Enter()
					defer m.Leave()
					time.Sleep(d)
					return nil
				}
			}
			// B holds a permit until A's delete was refused.
			held := make(chan struct{})
			bDone := make(chan error, 1)
			go func() {
				bDone <- replicaB.Do(ctx, "k", func(ctx context.Context) error {
					m.Enter()
					defer m.Leave()
					close(held)
					for deadline := time.Now().Add(20 * time.Second); cd.held.Load() == 0; time.Sleep(5 * time.Millisecond) {
						if time.Now().After(deadline) {
							return errors.New("A's delete was not refused within 20s")
						}
					}
					return nil
				})
			}()
			<-held
			if err := a.Do(ctx, "k", hold(0)); err != nil {
				t.Fatal(err)
			}
			if err := <-bDone; err != nil {
				t.Fatal(err)
			}
			if cd.held.Load() == 0 || cd.deleted.Load() != 0 {
				t.Fatalf("while B held a permit: %d deletes, %d refused; want 0, at least 1", cd.deleted.Load(), cd.held.Load())
			}

			// B uses the key from 3 goroutines for 3 s, and on until A has
			// deleted it at least once (at most 20 s: on a loaded machine
			// B's holds can cover every one of A's tries for a while); A
			// uses it now and then, so that it keeps expiring it between
			// B's holds.
			var wg sync.WaitGroup
			errs := make(chan error, 16)
			start := time.Now()
			running := func() bool {
				d := time.Since(start)
				return d < 3*time.Second || d < 20*time.Second && cd.deleted.Load() == 0
			}
			for range 3 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for running() {
						if err := replicaB.Do(ctx, "k", hold(2*time.Millisecond)); err != nil {
							errs <- err
							return
						}
						time.Sleep(30 * time.Millisecond)
					}
				}()
			}
			for running() {
				if err := a.Do(ctx, "k", hold(0)); err != nil {
					t.Fatalf("A: %v", err)
				}
				time.Sleep(4 * idle)
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Errorf("B: %v", err)
			}
			t.Logf("A deleted the key %d times, refused %d times; at most %d inside", cd.deleted.Load(), cd.held.Load(), m.Max())
			if m.Max() > permits {
				t.Fatalf("%d holders at once, %d permits", m.Max(), permits)
			}
			if cd.deleted.Load() == 0 {
				t.Fatal("A never deleted the key between B's holds: the race was not exercised")
			}
			// A's expiry is still running: its delete of the key after A's
			// last use may be under way, claiming every slot (a census
			// would see each slot held beside its ready token). Let it end
			// first; the key is then either gone (and B makes it again) or
			// unused.
			cd.stop()
			st, err := replicaB.Status(ctx, "k")
			if err != nil || st.Permits != permits || !st.Healthy {
				t.Fatalf("k after the race: %+v, %v", st, err)
			}
		})
	}
}

func TestIdleExpiryRejects(t *testing.T) {
	noop := func(context.Context, string) error { return nil }
	init := func(context.Context, string, int) (tokensem.Semaphore, error) { return nil, errors.New("unused") }
	for _, opt := range []semgroup.Option{semgroup.WithIdleExpiry(0, noop), semgroup.WithIdleExpiry(time.Second, nil)} {
		if _, err := semgroup.New(init, 1, opt); !errors.Is(err, tokensem.ErrInvalidOption) {
			t.Errorf("New = %v, want ErrInvalidOption", err)
		}
	}
}

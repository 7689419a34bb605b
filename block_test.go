package tokensem_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/natssem"
	"github.com/tokensem/tokensem/natssem/embedded"
)

// counted is a real semaphore that counts the permits its Acquire and
// TryAcquire return: the global permits a Block took. (A caller of a busy
// block waits at the global semaphore too, and a release handed on in the
// block cancels that wait: calls are not counted.)
type counted struct {
	*natssem.Semaphore
	acquires atomic.Int64
}

func (c *counted) Acquire(ctx context.Context) (tokensem.Permit, error) {
	return c.count(c.Semaphore.Acquire(ctx))
}

func (c *counted) TryAcquire(ctx context.Context) (tokensem.Permit, error) {
	return c.count(c.Semaphore.TryAcquire(ctx))
}

func (c *counted) count(p tokensem.Permit, err error) (tokensem.Permit, error) {
	if p != nil {
		c.acquires.Add(1)
	}
	return p, err
}

// globalSem makes semaphore name of n permits on srv and opens it on
// handles more connections of its own.
func globalSem(t *testing.T, srv *embedded.Server, name string, n, handles int, opts ...natssem.Option) []*counted {
	t.Helper()
	var out []*counted
	for i := range handles {
		nc, err := nats.Connect(srv.URL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		var s *natssem.Semaphore
		if i == 0 {
			s, err = natssem.Init(bounded(t), nc, name, n, opts...)
		} else {
			s, err = natssem.Open(bounded(t), nc, name)
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		out = append(out, &counted{Semaphore: s})
	}
	return out
}

func startNATS(t *testing.T) *embedded.Server {
	t.Helper()
	srv, err := embedded.Start(embedded.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return srv
}

func newBlock(t *testing.T, g tokensem.Semaphore, opts ...tokensem.BlockOption) *tokensem.Block {
	t.Helper()
	b, err := tokensem.NewBlock(g, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// TestBlockReusesItsPermits: callers one after another take one global
// permit per WithBlockReuse of them; the rest cost no global acquire. A
// block left idle gives its permit back.
func TestBlockReusesItsPermits(t *testing.T) {
	g := globalSem(t, startNATS(t), "global", 2, 1)[0]
	b := newBlock(t, g, tokensem.WithBlockReuse(8), tokensem.WithBlockIdle(200*time.Millisecond))
	ctx := bounded(t)
	var fences []uint64
	for range 40 {
		p, err := b.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		fences = append(fences, p.Fence())
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := p.Release(ctx); !errors.Is(err, tokensem.ErrReleased) {
			t.Fatalf("second Release: %v, want ErrReleased", err)
		}
	}
	if n := g.acquires.Load(); n != 5 {
		t.Errorf("40 callers, reuse 8: %d global acquires, want 5", n)
	}
	for i := 1; i < len(fences); i++ {
		if same := fences[i] == fences[i-1]; same != (i%8 != 0) {
			t.Errorf("caller %d has fence %d after %d: reuse 8 shares a global permit among 8 callers in a row", i, fences[i], fences[i-1])
		}
	}
	waitFor(t, "the idle block to give its permit back", func() bool { return available(t, g) == 2 })
}

// TestBlockNeverExceedsGlobal: two blocks of one global semaphore of 3
// permits, on connections of their own, each with 6 callers looping;
// never more than 3 callers hold at once across both, and the broker
// counts at least as many holders as the blocks' callers at every check.
func TestBlockNeverExceedsGlobal(t *testing.T) {
	const n = 3
	gs := globalSem(t, startNATS(t), "global", n, 2)
	blocks := []*tokensem.Block{
		newBlock(t, gs[0], tokensem.WithBlockReuse(4), tokensem.WithBlockIdle(5*time.Millisecond)),
		newBlock(t, gs[1], tokensem.WithBlockReuse(4), tokensem.WithBlockIdle(5*time.Millisecond)),
	}
	ctx := bounded(t)
	var inside, peak, cycles atomic.Int64
	stop := time.Now().Add(1500 * time.Millisecond)
	errs := make(chan error, 12)
	var wg sync.WaitGroup
	for i := range 12 {
		b := blocks[i%2]
		wg.Go(func() {
			for time.Now().Before(stop) {
				p, err := b.Acquire(ctx)
				if err != nil {
					errs <- err
					return
				}
				now := inside.Add(1)
				for old := peak.Load(); now > old && !peak.CompareAndSwap(old, now); old = peak.Load() {
				}
				time.Sleep(time.Millisecond)
				inside.Add(-1)
				cycles.Add(1)
				if err := p.Release(ctx); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if p := peak.Load(); p > n || p < 2 {
		t.Errorf("peak %d callers inside, want 2..%d", p, n)
	}
	global := gs[0].acquires.Load() + gs[1].acquires.Load()
	t.Logf("%d holds, %d global permits taken, peak %d", cycles.Load(), global, peak.Load())
	if global >= cycles.Load() {
		t.Errorf("%d global permits taken for %d holds: the blocks reused nothing", global, cycles.Load())
	}
	waitFor(t, "both blocks to give their permits back", func() bool { return available(t, gs[0]) == n })
}

// TestBlockHandsReleaseToWaiter: with the only global permit in the block,
// a caller's release goes to the block's waiting caller, whose wait at the
// global semaphore is cancelled: the broker never counts two holders, and
// no wait is left behind.
func TestBlockHandsReleaseToWaiter(t *testing.T) {
	g := globalSem(t, startNATS(t), "global", 1, 1)[0]
	b := newBlock(t, g, tokensem.WithBlockIdle(0))
	ctx := bounded(t)
	a, err := b.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan tokensem.Permit, 1)
	go func() {
		p, err := b.Acquire(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- p
	}()
	waitFor(t, "the second caller to wait at the global semaphore", func() bool {
		st, err := g.Status(ctx)
		return err == nil && st.Waiting == 1
	})
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	p := <-got
	if p == nil {
		t.FailNow()
	}
	if p.Token() != a.Token() || p.Fence() != a.Fence() {
		t.Errorf("the waiter holds %v (fence %d), want the released %v (fence %d) handed on in the block", p.Token(), p.Fence(), a.Token(), a.Fence())
	}
	if a.Err() != tokensem.ErrReleased || p.Err() != nil {
		t.Errorf("released permit's Err %v, handed-on permit's Err %v", a.Err(), p.Err())
	}
	st, err := g.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Held != 1 || st.Waiting != 0 {
		t.Errorf("global after the handoff: held %d waiting %d, want 1 and 0", st.Held, st.Waiting)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the permit back at the global semaphore (idle 0)", func() bool { return available(t, g) == 1 })
}

// TestBlockLossTellsTheHolder: when the global permit under a caller's
// permit is lost (the global semaphore force-deleted), the caller is told:
// Done closes and Err wraps ErrLeaseLost.
func TestBlockLossTellsTheHolder(t *testing.T) {
	srv := startNATS(t)
	g := globalSem(t, srv, "global", 2, 1, natssem.WithLease(time.Second))[0]
	b := newBlock(t, g)
	ctx := bounded(t)
	p, err := b.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := natssem.ForceDelete(ctx, nc, "global"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Done():
	case <-ctx.Done():
		t.Fatal("the block's caller was not told its global permit was lost")
	}
	if !errors.Is(p.Err(), tokensem.ErrLeaseLost) {
		t.Errorf("Err after the loss: %v, want ErrLeaseLost", p.Err())
	}
	if err := p.Release(ctx); !errors.Is(err, tokensem.ErrLeaseLost) {
		t.Errorf("Release after the loss: %v, want ErrLeaseLost", err)
	}
}

// TestBlockWaitEnds: a caller whose ctx ends while it waits gets ctx.Err()
// itself and holds nothing; a closed block refuses callers; AcquireAll takes
// a block's permit beside a regional one.
func TestBlockWaitEnds(t *testing.T) {
	srv := startNATS(t)
	g := globalSem(t, srv, "global", 1, 1)[0]
	regional := globalSem(t, srv, "regional", 1, 1)[0]
	b := newBlock(t, g)
	ctx := bounded(t)
	set, err := tokensem.AcquireAll(ctx, regional.Semaphore, b)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := b.Acquire(wctx); err != context.DeadlineExceeded {
		t.Errorf("a wait past its deadline: %v, want context.DeadlineExceeded itself", err)
	}
	if err := set.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the global permit back (nothing held by the ended wait)", func() bool {
		if available(t, g) == 1 {
			return true
		}
		// The released permit may sit free in the block until its idle bound.
		p, err := b.TryAcquire(ctx)
		if err == nil {
			_ = p.Release(ctx)
		}
		return false
	})
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx); !errors.Is(err, tokensem.ErrClosed) {
		t.Errorf("Acquire on a closed block: %v, want ErrClosed", err)
	}
	for _, o := range []tokensem.BlockOption{tokensem.WithBlockReuse(0), tokensem.WithBlockIdle(-time.Second)} {
		if _, err := tokensem.NewBlock(g, o); !errors.Is(err, tokensem.ErrInvalidOption) {
			t.Errorf("NewBlock with a bad option: %v, want ErrInvalidOption", err)
		}
	}
}

// TestBlockCloseEndsWaits: Close ends a wait under way at the global
// semaphore with ErrClosed, and the wait leaves nothing queued there.
func TestBlockCloseEndsWaits(t *testing.T) {
	g := globalSem(t, startNATS(t), "global", 1, 1)[0]
	ctx := bounded(t)
	held, err := g.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b := newBlock(t, g)
	got := make(chan error, 1)
	go func() {
		p, err := b.Acquire(ctx)
		if p != nil {
			_ = p.Release(ctx)
		}
		got <- err
	}()
	waitFor(t, "the block's caller to wait at the global semaphore", func() bool {
		st, err := g.Status(ctx)
		return err == nil && st.Waiting == 1
	})
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-got; !errors.Is(err, tokensem.ErrClosed) {
		t.Fatalf("a wait under way at Close: %v, want ErrClosed", err)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the permit free, nobody waiting", func() bool {
		st, err := g.Status(ctx)
		return err == nil && st.Available == 1 && st.Waiting == 0
	})
}

package semtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/driver"
	"github.com/tokensem/tokensem/reconciler"
)

// Weighted acquire (tokensem.Weighted): all or nothing, no deadlock
// between weighted callers, no starvation of a caller of every permit, a
// fence per permit, and at most N permits' weight inside at once.

func weightedOf(t testing.TB, s tokensem.Semaphore) tokensem.Weighted {
	t.Helper()
	w, ok := s.(tokensem.Weighted)
	if !ok {
		t.Fatalf("%T does not implement tokensem.Weighted", s)
	}
	return w
}

// weightMeter is the external check of the weighted at-most-N guarantee:
// holders add their weight on entry and take it off on exit.
type weightMeter struct {
	cur, max atomic.Int64
}

func (m *weightMeter) enter(k int) {
	cur := m.cur.Add(int64(k))
	for {
		old := m.max.Load()
		if cur <= old || m.max.CompareAndSwap(old, cur) {
			return
		}
	}
}

func (m *weightMeter) leave(k int) { m.cur.Add(-int64(k)) }

// takeAll acquires n permits one by one, waiting for each (unlike
// drainAll, it does not miss a token that is being handed back).
func takeAll(t testing.TB, s tokensem.Semaphore, n int) []tokensem.Permit {
	t.Helper()
	held := make([]tokensem.Permit, 0, n)
	for range n {
		held = append(held, mustAcquire(t, s, 20*time.Second))
	}
	return held
}

// testWeightedBasics: a set holds k distinct slots with their own fences;
// bad weights fail at once; a release returns all of them.
func testWeightedBasics(t *testing.T, b Backend) {
	const n = 4
	name := uniqueName(t)
	w := weightedOf(t, mustInit(t, b, name, n, Options{}))

	for _, tc := range []struct {
		k    int
		want error
	}{
		{0, tokensem.ErrInvalidPermits},
		{-1, tokensem.ErrInvalidPermits},
		{n + 1, tokensem.ErrWeightExceedsPermits},
	} {
		start := time.Now()
		if _, err := w.AcquireN(Context(t, 10*time.Second), tc.k); !errors.Is(err, tc.want) {
			t.Fatalf("AcquireN(%d): err = %v, want %v", tc.k, err, tc.want)
		}
		if _, err := w.TryAcquireN(Context(t, 10*time.Second), tc.k); !errors.Is(err, tc.want) {
			t.Fatalf("TryAcquireN(%d): err = %v, want %v", tc.k, err, tc.want)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("AcquireN(%d) took %v to refuse", tc.k, d)
		}
	}

	set, err := w.AcquireN(Context(t, 20*time.Second), 3)
	if err != nil {
		t.Fatalf("AcquireN(3): %v", err)
	}
	toks, fences := set.Tokens(), set.Fences()
	if set.Len() != 3 || len(toks) != 3 || len(fences) != 3 {
		t.Fatalf("set of %d permits, %d tokens, %d fences; want 3", set.Len(), len(toks), len(fences))
	}
	var slots []int
	for i, tok := range toks {
		if tok.Semaphore != name || tok.Index < 0 || tok.Index >= n {
			t.Fatalf("token %d: %+v", i, tok)
		}
		if fences[i] == 0 {
			t.Fatalf("fence %d is 0", i)
		}
		slots = append(slots, tok.Index)
	}
	slices.Sort(slots)
	if len(slices.Compact(slots)) != 3 {
		t.Fatalf("slots %v are not distinct", toks)
	}
	if _, err := w.TryAcquireN(t.Context(), 2); !errors.Is(err, tokensem.ErrNoPermit) {
		t.Fatalf("TryAcquireN(2) with 1 free: err = %v, want ErrNoPermit", err)
	}
	one, err := w.TryAcquire(t.Context())
	if err != nil {
		t.Fatalf("TryAcquire with 1 free: %v", err)
	}
	mustRelease(t, one)
	if err := set.Err(); err != nil {
		t.Fatalf("held set: Err = %v", err)
	}
	if err := set.Release(t.Context()); err != nil {
		t.Fatalf("release set: %v", err)
	}
	select {
	case <-set.Done():
	default:
		t.Fatal("Done not closed after Release")
	}
	if err := set.Release(t.Context()); !errors.Is(err, tokensem.ErrReleased) {
		t.Fatalf("second Release: %v, want ErrReleased", err)
	}
	eventually(t, 10*time.Second, "every permit free after the release", func() bool {
		again, err := w.TryAcquireN(t.Context(), n)
		if err != nil {
			return false
		}
		return again.Release(t.Context()) == nil
	})
}

// testWeightedCancel: a weighted caller that gives up (deadline or cancel)
// while it holds part of its weight hands every gathered permit on.
func testWeightedCancel(t *testing.T, b Backend) {
	const n = 4
	name := uniqueName(t)
	s := mustInit(t, b, name, n, Options{Lease: 60 * time.Second})
	w := weightedOf(t, mustOpen(t, b, b.Addr, name, Options{}))
	held := takeAll(t, s, n)
	// Free two of four: a caller of three gathers two and waits for a third.
	mustRelease(t, held[0])
	mustRelease(t, held[1])
	if _, err := w.AcquireN(Context(t, 1500*time.Millisecond), 3); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("AcquireN(3) with 2 free: err = %v, want DeadlineExceeded", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { _, err := w.AcquireN(ctx, 3); done <- err }()
	eventually(t, 10*time.Second, "the gatherer's third request queued", func() bool {
		st := status(t, s)
		return st.Held >= n && st.Waiting >= 1
	})
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled AcquireN: err = %v, want Canceled", err)
	}
	var two *tokensem.PermitSet
	eventually(t, 10*time.Second, "the two gathered permits free again", func() bool {
		var err error
		two, err = w.TryAcquireN(t.Context(), 2)
		return err == nil
	})
	if err := two.Release(t.Context()); err != nil {
		t.Fatalf("release: %v", err)
	}
	mustRelease(t, held[2])
	mustRelease(t, held[3])
	eventually(t, 10*time.Second, "all four free", func() bool {
		all, err := w.TryAcquireN(t.Context(), n)
		if err != nil {
			return false
		}
		return all.Release(t.Context()) == nil
	})
}

// testWeightedMixed: clients of weights 3, 2 and 1 on N=4, each on its own
// connection, loop until each has had several turns: none deadlocks, and the
// weight inside (by an external meter) never exceeds 4 and reaches it.
func testWeightedMixed(t *testing.T, b Backend) {
	const n, rounds = 4, 4
	name := uniqueName(t)
	mustInit(t, b, name, n, Options{})
	var (
		m  weightMeter
		wg sync.WaitGroup
	)
	for i, k := range []int{3, 3, 2, 2, 1, 1} {
		w := weightedOf(t, mustOpen(t, b, b.Addr, name, Options{}))
		wg.Go(func() {
			for r := range rounds {
				set, err := w.AcquireN(Context(t, 60*time.Second), k)
				if err != nil {
					t.Errorf("caller %d (weight %d) round %d: %v", i, k, r, err)
					return
				}
				m.enter(k)
				time.Sleep(20 * time.Millisecond)
				m.leave(k)
				if err := set.Release(t.Context()); err != nil {
					t.Errorf("caller %d release: %v", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if got := m.max.Load(); got > n {
		t.Fatalf("weight inside reached %d > %d permits", got, n)
	}
	if got := m.max.Load(); got < 3 {
		t.Errorf("weight inside never went above %d", got)
	}
}

// testWeightedNoDeadlock: two callers of 3 permits on N=4 start at the
// same moment while every permit is held, then all four are freed at once.
// Gathering without taking turns, their requests interleave and each ends
// up sitting on 2 when their requests interleave (rare, but a re-issued
// request or a slow link makes it happen); with the gate one gathers 3
// while the other waits for its turn, then the other: only one gatherer's
// requests are ever queued, which the test checks.
func testWeightedNoDeadlock(t *testing.T, b Backend) {
	const n, k, trials = 4, 3, 4
	name := uniqueName(t)
	s := mustInit(t, b, name, n, Options{})
	a := weightedOf(t, mustOpen(t, b, b.Addr, name, Options{}))
	c := weightedOf(t, mustOpen(t, b, b.Addr, name, Options{}))
	for trial := range trials {
		// The previous trial's permits were handed back by other clients
		// a moment ago: wait for them.
		held := takeAll(t, s, n)
		start := make(chan struct{})
		errs := make(chan error, 2)
		for _, w := range []tokensem.Weighted{a, c} {
			go func() {
				<-start
				set, err := w.AcquireN(Context(t, 20*time.Second), k)
				if err == nil {
					time.Sleep(20 * time.Millisecond)
					err = set.Release(t.Context())
				}
				errs <- err
			}()
		}
		close(start)
		eventually(t, 10*time.Second, "the gatherer's requests queued", func() bool { return status(t, s).Waiting >= k })
		time.Sleep(200 * time.Millisecond) // the other caller's requests, if any, queue too
		// Taking turns: only one gatherer's requests are queued. Two
		// gatherers' interleaved requests are how each ends up on 2.
		if w := status(t, s).Waiting; w != k {
			t.Fatalf("trial %d: %d requests queued for permits while two callers of %d gather; want %d (one gatherer at a time)", trial, w, k, k)
		}
		for _, p := range held {
			mustRelease(t, p)
		}
		for range 2 {
			if err := <-errs; err != nil {
				t.Fatalf("trial %d: a caller of %d of %d permits: %v (deadlocked with the other?)", trial, k, n, err)
			}
		}
	}
}

// testWeightedNoStarvation: a caller of all N permits among a stream of
// single-permit callers gets them, while the stream goes on.
func testWeightedNoStarvation(t *testing.T, b Backend) { weightedAmongSingles(t, b, 0) }

// testWeightedLowClass is testWeightedNoStarvation with the caller of all
// the permits in class -2 among single callers of the default class: once
// through the gate it gathers in the default class, not below, so it is
// served as before instead of sitting on what it gathered while the
// singles take every permit freed.
func testWeightedLowClass(t *testing.T, b Backend) { weightedAmongSingles(t, b, -2) }

// weightedAmongSingles: a caller of all n permits, waiting in class,
// among single callers of the default class that keep the semaphore busy,
// is served, twice, and the weight inside never exceeds n.
func weightedAmongSingles(t *testing.T, b Backend, class tokensem.Priority) {
	const n, singles = 3, 6
	name := uniqueName(t)
	mustInit(t, b, name, n, Options{})
	stop := make(chan struct{})
	var (
		served atomic.Int64
		m      weightMeter
		wg     sync.WaitGroup
	)
	for i := range singles {
		c := mustOpen(t, b, b.Addr, name, Options{})
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				p, err := c.Acquire(Context(t, 60*time.Second))
				if err != nil {
					t.Errorf("single %d: %v", i, err)
					return
				}
				m.enter(1)
				time.Sleep(10 * time.Millisecond)
				m.leave(1)
				served.Add(1)
				if err := p.Release(t.Context()); err != nil {
					t.Errorf("single %d release: %v", i, err)
					return
				}
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	eventually(t, 20*time.Second, "the single-permit stream running", func() bool { return served.Load() >= 2*singles })

	w := weightedOf(t, mustOpen(t, b, b.Addr, name, Options{}))
	for round := range 2 {
		before := served.Load()
		set, err := w.AcquireN(tokensem.WithPriority(Context(t, 60*time.Second), class), n)
		if err != nil {
			t.Fatalf("round %d: AcquireN(%d) among %d single callers: %v", round, n, singles, err)
		}
		m.enter(n)
		time.Sleep(50 * time.Millisecond)
		m.leave(n)
		if err := set.Release(t.Context()); err != nil {
			t.Fatalf("release: %v", err)
		}
		t.Logf("round %d: the caller of %d permits was served after %d single holds", round, n, served.Load()-before)
	}
	if got := m.max.Load(); got > n {
		t.Fatalf("weight inside reached %d > %d permits", got, n)
	}
}

// testWeightedLoss: the loss of one permit of a set is the loss of the set:
// Done closes, Err wraps ErrLeaseLost, and the set hands its other permits
// back by itself.
func testWeightedLoss(t *testing.T, b Backend) {
	const n = 3
	name := uniqueName(t)
	w := weightedOf(t, mustInit(t, b, name, n, Options{}))
	set, err := w.AcquireN(Context(t, 20*time.Second), n)
	if err != nil {
		t.Fatalf("AcquireN: %v", err)
	}
	// Releasing one member behind the set's back ends that member's hold as
	// a loss would, without waiting out a lease.
	if err := set.Permits()[1].Release(t.Context()); err != nil {
		t.Fatalf("release one member: %v", err)
	}
	select {
	case <-set.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("set's Done not closed after losing a member")
	}
	if err := set.Err(); !errors.Is(err, tokensem.ErrLeaseLost) {
		t.Fatalf("set Err = %v, want ErrLeaseLost", err)
	}
	if err := set.Release(t.Context()); !errors.Is(err, tokensem.ErrLeaseLost) {
		t.Fatalf("Release after the loss: %v, want ErrLeaseLost", err)
	}
	eventually(t, 10*time.Second, "every permit of the lost set free again", func() bool {
		all, err := w.TryAcquireN(t.Context(), n)
		if err != nil {
			return false
		}
		return all.Release(t.Context()) == nil
	})
}

// testAcquireAll: one permit of each of several semaphores, in any order
// the callers name them, all or nothing.
func testAcquireAll(t *testing.T, b Backend) {
	eu, us, global := uniqueName(t), uniqueName(t), uniqueName(t)
	seu := mustInit(t, b, eu, 2, Options{})
	sus := mustInit(t, b, us, 2, Options{})
	sglobal := mustInit(t, b, global, 3, Options{})

	if _, err := tokensem.AcquireAll(t.Context(), seu, seu); !errors.Is(err, tokensem.ErrAmbiguousOrder) {
		t.Fatalf("AcquireAll of one semaphore twice: %v, want ErrAmbiguousOrder", err)
	}
	// All or nothing: with global exhausted, TryAcquireAll takes nothing.
	g := takeAll(t, sglobal, 3)
	if _, err := tokensem.TryAcquireAll(t.Context(), seu, sglobal); !errors.Is(err, tokensem.ErrNoPermit) {
		t.Fatalf("TryAcquireAll with global exhausted: %v, want ErrNoPermit", err)
	}
	if _, err := tokensem.AcquireAll(Context(t, 300*time.Millisecond), sglobal, sus); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("AcquireAll with global exhausted: %v, want DeadlineExceeded", err)
	}
	for _, p := range g {
		mustRelease(t, p)
	}
	eventually(t, 10*time.Second, "eu and us untouched by the failed calls", func() bool {
		a, b := drainAll(t, seu, 2), drainAll(t, sus, 2)
		for _, p := range append(a, b...) {
			mustRelease(t, p)
		}
		return len(a) == 2 && len(b) == 2
	})

	// Regions eu (2) and us (2) under global (3); half the callers name
	// them in reverse order. Nobody deadlocks and no limit is exceeded.
	var (
		mEU, mUS, mGlobal weightMeter
		wg                sync.WaitGroup
	)
	for i := range 8 {
		ceu := mustOpen(t, b, b.Addr, eu, Options{})
		cus := mustOpen(t, b, b.Addr, us, Options{})
		cg := mustOpen(t, b, b.Addr, global, Options{})
		region, m := ceu, &mEU
		if i%2 == 1 {
			region, m = cus, &mUS
		}
		sems := []tokensem.Semaphore{region, cg}
		if i%4 >= 2 {
			sems = []tokensem.Semaphore{cg, region}
		}
		wg.Go(func() {
			for r := range 4 {
				set, err := tokensem.AcquireAll(Context(t, 60*time.Second), sems...)
				if err != nil {
					t.Errorf("caller %d round %d: %v", i, r, err)
					return
				}
				if set.Len() != 2 || set.Tokens()[0].Semaphore != sems[0].(interface{ Name() string }).Name() {
					t.Errorf("caller %d: set %v is not in the order given", i, set.Tokens())
				}
				m.enter(1)
				mGlobal.enter(1)
				time.Sleep(15 * time.Millisecond)
				mGlobal.leave(1)
				m.leave(1)
				if err := set.Release(t.Context()); err != nil {
					t.Errorf("caller %d release: %v", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if mEU.max.Load() > 2 || mUS.max.Load() > 2 || mGlobal.max.Load() > 3 {
		t.Fatalf("inside at most: eu %d (2), us %d (2), global %d (3)", mEU.max.Load(), mUS.max.Load(), mGlobal.max.Load())
	}
}

// testWeightedGateRepaired: the gate is a semaphore of one token, which can
// be lost like any other; while it is gone weighted callers wait, and a
// reconcile of the semaphore issues it again.
func testWeightedGateRepaired(t *testing.T, b Backend) {
	const n = 2
	name := uniqueName(t)
	s := mustInit(t, b, name, n, Options{})
	w := weightedOf(t, s)
	inv, ok := b.Inventory(s).(driver.Gated)
	if !ok {
		t.Fatalf("%T is not a driver.Gated", b.Inventory(s))
	}
	ctx := Context(t, time.Minute)
	if g, err := inv.Gate(ctx); err != nil || g != nil {
		t.Fatalf("Gate before any weighted caller: %v, %v; want none", g, err)
	}
	set, err := w.AcquireN(ctx, n)
	if err != nil {
		t.Fatalf("AcquireN: %v", err)
	}
	if err := set.Release(ctx); err != nil {
		t.Fatalf("release: %v", err)
	}
	gate, err := inv.Gate(ctx)
	if err != nil || gate == nil {
		t.Fatalf("Gate after AcquireN: %v, %v", gate, err)
	}
	// Lose the gate's token, as a broker that drops a message would.
	unlock, err := gate.Lock(ctx)
	if err != nil {
		t.Fatalf("lock the gate: %v", err)
	}
	c, err := gate.Census(ctx)
	if err == nil && len(c.Entries) != 1 {
		err = fmt.Errorf("%d gate tokens, want 1", len(c.Entries))
	}
	if err == nil {
		err = gate.Remove(ctx, c.Entries[0])
	}
	unlock()
	if err != nil {
		t.Fatalf("remove the gate's token: %v", err)
	}
	if _, err := w.AcquireN(Context(t, 500*time.Millisecond), n); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("AcquireN with the gate's token lost: %v, want DeadlineExceeded", err)
	}
	r, err := reconciler.Run(ctx, inv, true)
	if err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	if r.Gate == nil || r.Gate.Issued != 1 || !r.Healthy {
		t.Fatalf("reconcile: %+v (gate %+v); want the gate's token issued and healthy", r, r.Gate)
	}
	eventually(t, 10*time.Second, "AcquireN served again", func() bool {
		set, err := w.AcquireN(Context(t, 2*time.Second), n)
		return err == nil && set.Release(t.Context()) == nil
	})
}

// testWeightedAfterDelete: Delete removes the gate with its semaphore; a
// client that made the gate before the delete makes it again when the
// name is created anew, and weighted callers are served.
func testWeightedAfterDelete(t *testing.T, b Backend) {
	if b.Delete == nil {
		t.Skip("the backend cannot delete")
	}
	const n = 2
	name := uniqueName(t)
	old := weightedOf(t, mustInit(t, b, name, n, Options{}))
	ctx := Context(t, time.Minute)
	set, err := old.AcquireN(ctx, n)
	if err != nil {
		t.Fatalf("AcquireN: %v", err)
	}
	if err := set.Release(ctx); err != nil {
		t.Fatalf("release: %v", err)
	}
	if err := b.Delete(t, name, false); err != nil {
		t.Fatalf("delete: %v", err)
	}
	fresh := mustInit(t, b, name, n, Options{})
	if g, err := b.Inventory(fresh).(driver.Gated).Gate(ctx); err != nil || g != nil {
		t.Fatalf("the gate after Delete and Init: %v, %v; want none (deleted with its semaphore)", g, err)
	}
	if infos, err := b.List(t); err != nil {
		t.Fatalf("list: %v", err)
	} else {
		for _, info := range infos {
			if strings.Contains(info.Name, name) && info.Name != name {
				t.Errorf("List shows %q beside %q", info.Name, name)
			}
		}
	}
	set, err = old.AcquireN(ctx, n)
	if err != nil {
		t.Fatalf("AcquireN on a client older than the delete: %v", err)
	}
	if err := set.Release(ctx); err != nil {
		t.Fatalf("release: %v", err)
	}
}

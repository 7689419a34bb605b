package tokensem_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/faultproxy"
	"github.com/tokensem/tokensem/natssem"
	"github.com/tokensem/tokensem/natssem/embedded"
)

// The attacks on tokensem.Block: real natssem semaphores on an embedded
// NATS server, callers that churn with random deadlines, cancellations,
// priorities, TryAcquire beside Acquire, Close in the middle, global
// permits lost (force-deleted, or a block's link paused past the lease).

// holders is the exactness meter: every caller that got a permit (of a
// block or of the global semaphore itself) enters it, and leaves before
// it releases. A caller counts as holding until its permit's Done closes,
// so a holder that was told of a loss but not yet scheduled does not count,
// and one whose Done is still open when another caller gets the same global
// slot (or one permit more than the global semaphore has) is a violation:
// its Done was open after the other's Acquire had returned.
type holders struct {
	n     int
	mu    sync.Mutex
	by    map[int][]held // global slot index -> holders
	max   int
	fails []string
}

type held struct {
	who string
	p   tokensem.Permit
}

func newHolders(n int) *holders { return &holders{n: n, by: map[int][]held{}} }

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func (h *holders) fail(format string, args ...any) {
	if len(h.fails) < 20 {
		h.fails = append(h.fails, fmt.Sprintf(format, args...))
	}
}

func (h *holders) enter(who string, p tokensem.Permit) {
	h.mu.Lock()
	defer h.mu.Unlock()
	total := 0
	for i, hs := range h.by {
		hs = slices.DeleteFunc(hs, func(x held) bool { return closed(x.p.Done()) })
		h.by[i] = hs
		total += len(hs)
	}
	idx := p.Token().Index
	for _, x := range h.by[idx] {
		h.fail("%s got global slot %d (fence %d, epoch %d) while %s still holds it (fence %d, epoch %d, Err %v)",
			who, idx, p.Fence(), p.Token().Epoch, x.who, x.p.Fence(), x.p.Token().Epoch, x.p.Err())
	}
	if total+1 > h.n {
		h.fail("%s is the %d-th holder of a global semaphore of %d permits", who, total+1, h.n)
	}
	h.max = max(h.max, total+1)
	h.by[idx] = append(h.by[idx], held{who, p})
}

func (h *holders) leave(p tokensem.Permit) {
	h.mu.Lock()
	defer h.mu.Unlock()
	idx := p.Token().Index
	h.by[idx] = slices.DeleteFunc(h.by[idx], func(x held) bool { return x.p == p })
}

func (h *holders) check(t *testing.T) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, f := range h.fails {
		t.Error(f)
	}
}

// errs counts the errors callers saw, by kind, and records the wrong ones.
type errs struct {
	mu    sync.Mutex
	kinds map[string]int
	bad   []string
}

func (e *errs) add(kind string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.kinds == nil {
		e.kinds = map[string]int{}
	}
	e.kinds[kind]++
}

func (e *errs) wrong(format string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.bad) < 20 {
		e.bad = append(e.bad, fmt.Sprintf(format, args...))
	}
}

func (e *errs) check(t *testing.T) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	var ks []string
	for k, n := range e.kinds {
		ks = append(ks, fmt.Sprintf("%s=%d", k, n))
	}
	sort.Strings(ks)
	t.Logf("outcomes: %s", strings.Join(ks, " "))
	for _, b := range e.bad {
		t.Error(b)
	}
}

// isCtxErr reports whether err is one of the context errors itself (not
// wrapped): what an Acquire returns when its ctx ends, and only then.
func isCtxErr(err error) bool { return err == context.Canceled || err == context.DeadlineExceeded }

// callCtx makes the context of one call: the parent, or one that ends
// after a random short while (deadline or cancel), at a random priority.
func callCtx(parent context.Context, r *rand.Rand) (context.Context, context.CancelFunc) {
	ctx := parent
	if r.IntN(3) == 0 {
		ctx = tokensem.WithPriority(ctx, tokensem.Priority(r.IntN(5)-2))
	}
	switch r.IntN(6) {
	case 0, 1:
		return context.WithTimeout(ctx, time.Duration(r.IntN(4000))*time.Microsecond)
	case 2:
		c, cancel := context.WithCancel(ctx)
		t := time.AfterFunc(time.Duration(r.IntN(3000))*time.Microsecond, cancel)
		return c, func() { t.Stop(); cancel() }
	}
	return context.WithCancel(ctx)
}

// worker is one churning caller.
type worker struct {
	name    string
	sem     tokensem.Semaphore // a Block, or the global semaphore itself
	block   *tokensem.Block    // nil for an exact-mode caller
	meter   *holders
	errs    *errs
	loss    bool // global permits may be lost in this test
	stop    <-chan struct{}
	holdMax time.Duration // hold up to this long
	think   time.Duration // between calls, pause up to this long (so the block has free permits)
	calm    bool          // calls only with the parent ctx
	ops     atomic.Int64
	lost    *atomic.Int64 // holds that ended by the loss of their global permit
	// afterDelete, when set, is true once the global semaphore was
	// force-deleted and the delete returned: an Acquire that starts then
	// must not succeed.
	afterDelete *atomic.Bool
	all         *[]tokensem.Permit // every permit handed out, under allMu
	allMu       *sync.Mutex
	// phase, when set, names the phase of the test in the outcome counts
	// of this worker's holds and losses (label and phase).
	phase *atomic.Int32
	label string
}

func (w *worker) run(parent context.Context, seed uint64) {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for !closed(w.stop) {
		w.once(parent, r)
		if w.think > 0 {
			time.Sleep(time.Duration(r.Int64N(int64(w.think))))
		}
	}
}

func (w *worker) once(parent context.Context, r *rand.Rand) {
	ctx, cancel := callCtx(parent, r)
	if w.calm {
		cancel()
		ctx, cancel = context.WithCancel(parent)
	}
	defer cancel()
	try := r.IntN(4) == 0
	deleted := w.afterDelete != nil && w.afterDelete.Load()
	var p tokensem.Permit
	var err error
	if try {
		p, err = w.sem.TryAcquire(ctx)
	} else {
		p, err = w.sem.Acquire(ctx)
	}
	w.ops.Add(1)
	op := "Acquire"
	if try {
		op = "TryAcquire"
	}
	if err != nil {
		if p != nil {
			w.errs.wrong("%s: %s returned a permit and an error %v", w.name, op, err)
		}
		cerr := ctx.Err()
		switch {
		case isCtxErr(err):
			if err != cerr {
				w.errs.wrong("%s: %s returned %v, but its ctx's Err is %v", w.name, op, err, cerr)
			}
			w.errs.add("ctx")
		case errors.Is(err, tokensem.ErrNoPermit) && try:
			w.errs.add("nopermit")
		case errors.Is(err, tokensem.ErrClosed):
			w.errs.add("closed")
			time.Sleep(time.Millisecond) // a closed block: keep looping, gently
		case w.loss:
			w.errs.add(kindOf(err))
		default:
			w.errs.wrong("%s: %s: unexpected error %v (ctx %v)", w.name, op, err, cerr)
		}
		if errors.Is(err, tokensem.ErrNotInitialized) {
			time.Sleep(time.Millisecond)
		}
		return
	}
	if p == nil {
		w.errs.wrong("%s: %s returned neither a permit nor an error", w.name, op)
		return
	}
	if deleted {
		w.errs.wrong("%s: %s started after the global semaphore's ForceDelete returned, and got %v (fence %d, Err %v)",
			w.name, op, p.Token(), p.Fence(), p.Err())
	}
	if w.all != nil {
		w.allMu.Lock()
		*w.all = append(*w.all, p)
		w.allMu.Unlock()
	}
	if perr := p.Err(); perr != nil {
		if !closed(p.Done()) {
			w.errs.wrong("%s: a permit with Err %v and Done open", w.name, perr)
		}
		if !w.loss {
			w.errs.wrong("%s: %s returned a permit already ended: %v", w.name, op, perr)
		}
	}
	w.meter.enter(w.name, p)
	w.errs.add("held")
	if w.phase != nil {
		w.errs.add(fmt.Sprintf("held.%s.phase%d", w.label, w.phase.Load()))
	}
	var hold <-chan time.Time
	if d := time.Duration(r.Int64N(int64(w.holdMax) + 1)); d > 0 {
		hold = time.After(d)
	} else {
		c := make(chan time.Time)
		close(c)
		hold = c
	}
	lost := false
	select {
	case <-p.Done():
		lost = true
	case <-hold:
	}
	w.meter.leave(p)
	if lost {
		w.lost.Add(1)
		if w.phase != nil {
			w.errs.add(fmt.Sprintf("lost.%s.phase%d", w.label, w.phase.Load()))
		}
		if !w.loss {
			w.errs.wrong("%s: a permit ended while held: %v", w.name, p.Err())
		}
		if !errors.Is(p.Err(), tokensem.ErrLeaseLost) {
			w.errs.wrong("%s: a held permit's Done closed with %v, want ErrLeaseLost", w.name, p.Err())
		}
	}
	rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer rcancel()
	rerr := p.Release(rctx)
	if rerr != nil {
		w.errs.add("release." + kindOf(rerr))
	}
	switch {
	case rerr == nil:
		if p.Err() != tokensem.ErrReleased {
			w.errs.wrong("%s: released, but Err is %v", w.name, p.Err())
		}
	case !w.loss:
		w.errs.wrong("%s: Release: %v", w.name, rerr)
	case p.Err() == nil:
		w.errs.wrong("%s: Release failed (%v) and the permit still believes it holds", w.name, rerr)
	}
	if !closed(p.Done()) {
		w.errs.wrong("%s: Done open after Release (%v)", w.name, rerr)
	}
}

func kindOf(err error) string {
	switch {
	case errors.Is(err, tokensem.ErrNotInitialized):
		return "notinit"
	case errors.Is(err, tokensem.ErrLeaseLost):
		return "leaselost"
	}
	return "other"
}

// drained waits until every global permit is back and nobody waits at the
// global semaphore.
func drained(t *testing.T, g tokensem.Semaphore, n int) {
	t.Helper()
	waitFor(t, "every global permit back, and no global wait left", func() bool {
		st, err := g.Status(bounded(t))
		if err != nil {
			t.Fatal(err)
		}
		return st.Available == n && st.Waiting == 0 && st.Held == 0
	})
}

// TestBlockAttackChurn: two blocks of one global semaphore (on handles of
// their own) and exact-mode callers on a third handle churn with random
// deadlines, cancellations and priorities, TryAcquire mixed in, and one
// block closed midway. Never two callers on one global slot, never more
// holders than permits; a failed call returns ctx.Err() itself (when its
// ctx ended), ErrNoPermit (TryAcquire) or ErrClosed and nothing else; at
// the end every global permit is back and no global wait is left.
func TestBlockAttackChurn(t *testing.T) {
	t.Parallel() // each on a server of its own
	srv := startNATS(t)
	configs := []struct {
		idle  time.Duration
		reuse int
	}{{0, 1}, {0, 3}, {time.Millisecond, 2}, {time.Millisecond, 3}, {5 * time.Millisecond, 2}, {20 * time.Millisecond, 3}}
	for ci, c := range configs {
		t.Run(fmt.Sprintf("idle=%v,reuse=%d", c.idle, c.reuse), func(t *testing.T) {
			const n = 3
			gs := globalSem(t, srv, fmt.Sprintf("churn%d", ci), n, 3)
			blocks := []*tokensem.Block{
				newBlock(t, gs[0], tokensem.WithBlockIdle(c.idle), tokensem.WithBlockReuse(c.reuse)),
				newBlock(t, gs[1], tokensem.WithBlockIdle(c.idle), tokensem.WithBlockReuse(c.reuse)),
			}
			meter, e := newHolders(n), &errs{}
			stop := make(chan struct{})
			ctx := bounded(t)
			var lost atomic.Int64
			var ws []*worker
			for i := range 12 {
				// Most callers pause between calls: the blocks then have
				// no waiter at times, and keep released permits free.
				w := &worker{meter: meter, errs: e, stop: stop, holdMax: 2 * time.Millisecond, lost: &lost}
				if i%5 != 0 {
					w.think = 6 * time.Millisecond
				}
				switch {
				case i < 5:
					w.name, w.sem, w.block = fmt.Sprintf("A%d", i), blocks[0], blocks[0]
				case i < 10:
					w.name, w.sem, w.block = fmt.Sprintf("B%d", i), blocks[1], blocks[1]
				default:
					w.name, w.sem = fmt.Sprintf("exact%d", i), gs[2]
				}
				ws = append(ws, w)
			}
			var wg sync.WaitGroup
			for i, w := range ws {
				wg.Go(func() { w.run(ctx, uint64(ci*100+i)) })
			}
			time.Sleep(300 * time.Millisecond)
			if err := blocks[0].Close(); err != nil {
				t.Error(err)
			}
			time.Sleep(300 * time.Millisecond)
			close(stop)
			wg.Wait()
			if _, err := blocks[0].Acquire(ctx); !errors.Is(err, tokensem.ErrClosed) {
				t.Errorf("Acquire on the closed block: %v", err)
			}
			if err := blocks[1].Close(); err != nil {
				t.Error(err)
			}
			meter.check(t)
			e.check(t)
			var ops int64
			for _, w := range ws {
				ops += w.ops.Load()
			}
			t.Logf("%d calls, most holders at once %d of %d, global acquires %d+%d (exact %d)",
				ops, meter.max, n, gs[0].acquires.Load(), gs[1].acquires.Load(), gs[2].acquires.Load())
			drained(t, gs[0], n)
		})
	}
}

// TestBlockAttackCloseRounds: rounds of a fresh block whose callers are
// mid-flight (waiting at the global semaphore, handed a release, idle
// timers running) when Close lands at a random moment; callers keep
// calling after it. Every global permit is back after each round.
func TestBlockAttackCloseRounds(t *testing.T) {
	t.Parallel() // each on a server of its own
	const n = 2
	g := globalSem(t, startNATS(t), "rounds", n, 1)[0]
	ctx := bounded(t)
	meter, e := newHolders(n), &errs{}
	var lost atomic.Int64
	for round := range 12 {
		b, err := tokensem.NewBlock(g, tokensem.WithBlockIdle(time.Duration(round%4)*3*time.Millisecond), tokensem.WithBlockReuse(1+round%3))
		if err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for i := range 6 {
			w := &worker{name: fmt.Sprintf("r%d.%d", round, i), sem: b, block: b, meter: meter, errs: e, stop: stop,
				holdMax: time.Millisecond, think: time.Duration(1+i) * time.Millisecond, lost: &lost}
			wg.Go(func() { w.run(ctx, uint64(round*10+i)) })
		}
		time.Sleep(time.Duration(5+rand.IntN(40)) * time.Millisecond)
		_ = b.Close()
		time.Sleep(time.Duration(rand.IntN(5)) * time.Millisecond)
		close(stop)
		wg.Wait()
		drained(t, g, n)
	}
	meter.check(t)
	e.check(t)
}

// TestBlockAttackIdleRace: few callers that pause about as long as the
// block's idle bound between short holds, so a released permit sits free
// in the block and its idle timer fires as often as a caller takes it: the
// timer's retire races take, bind and a later place of the same permit.
// Exactness holds, and every global permit is back at the end.
func TestBlockAttackIdleRace(t *testing.T) {
	t.Parallel() // each on a server of its own
	const n = 2
	gs := globalSem(t, startNATS(t), "idle", n, 2)
	ctx := bounded(t)
	meter, e := newHolders(n), &errs{}
	var lost atomic.Int64
	for _, idle := range []time.Duration{time.Millisecond, 2 * time.Millisecond} {
		blocks := []*tokensem.Block{
			newBlock(t, gs[0], tokensem.WithBlockIdle(idle), tokensem.WithBlockReuse(3)),
			newBlock(t, gs[1], tokensem.WithBlockIdle(idle), tokensem.WithBlockReuse(1000)),
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for i := range 6 {
			b := blocks[i%2]
			w := &worker{name: fmt.Sprintf("idle%v.%d", idle, i), sem: b, block: b, meter: meter, errs: e, stop: stop,
				holdMax: 500 * time.Microsecond, think: 2 * idle, calm: true, lost: &lost}
			wg.Go(func() { w.run(ctx, uint64(3000+i)) })
		}
		time.Sleep(700 * time.Millisecond)
		close(stop)
		wg.Wait()
		for _, b := range blocks {
			_ = b.Close()
		}
		drained(t, gs[0], n)
	}
	meter.check(t)
	e.check(t)
	t.Logf("global acquires %d+%d", gs[0].acquires.Load(), gs[1].acquires.Load())
}

// slowCancel is a real natssem semaphore whose Acquire, once its ctx was
// cancelled, takes until gate closes to return: a broker that is slow to
// answer (natssem returns within about a round trip of ctx's end, bounded
// by the request timeout). It hands out the permits it acquired.
type slowCancel struct {
	*natssem.Semaphore
	gate     chan struct{}
	gateOnce sync.Once
	stalled  chan struct{}
	mu       sync.Mutex
	got      []tokensem.Permit
}

func (s *slowCancel) open() { s.gateOnce.Do(func() { close(s.gate) }) }

func (s *slowCancel) Acquire(ctx context.Context) (tokensem.Permit, error) {
	p, err := s.Semaphore.Acquire(ctx)
	if p != nil {
		s.mu.Lock()
		s.got = append(s.got, p)
		s.mu.Unlock()
	}
	if p == nil && ctx.Err() != nil {
		select {
		case s.stalled <- struct{}{}:
		default:
		}
		<-s.gate
	}
	return p, err
}

// TestBlockAttackHandedPermitLost: a release hands the block's only global
// permit to the block's waiting caller. The caller's wait at the global
// semaphore stays under way, spare, for the block's next caller, and is
// slow to end once cancelled (its Acquire stalls): the handoff must not
// wait for it, nor for the spare's cancel past the idle bound. Then the
// global permit is lost (ForceDelete): the caller holding it is told (Done
// closes, Err wraps ErrLeaseLost).
func TestBlockAttackHandedPermitLost(t *testing.T) {
	t.Parallel() // each on a server of its own
	srv := startNATS(t)
	const lease = 500 * time.Millisecond
	g := &slowCancel{
		Semaphore: globalSem(t, srv, "handed", 1, 1, natssem.WithLease(lease))[0].Semaphore,
		gate:      make(chan struct{}), stalled: make(chan struct{}, 1),
	}
	b := newBlock(t, g, tokensem.WithBlockIdle(100*time.Millisecond))
	t.Cleanup(g.open) // before the block's Close, which waits for its global waits
	ctx := bounded(t)
	a, err := b.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		p   tokensem.Permit
		err error
	}
	got := make(chan result, 1)
	go func() {
		p, err := b.Acquire(ctx)
		got <- result{p, err}
	}()
	waitFor(t, "the second caller to wait at the global semaphore", func() bool {
		st, err := g.Status(ctx)
		return err == nil && st.Waiting == 1
	})
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-got:
	case <-ctx.Done():
		t.Fatal("the handoff waited for the global wait the caller left")
	}
	if r.err != nil || r.p.Fence() != a.Fence() || r.p.Err() != nil {
		t.Fatalf("the waiter's Acquire: %v, %v; want the released permit (fence %d), held", r.p, r.err, a.Fence())
	}
	select {
	case <-g.stalled: // the spare wait, cancelled past the idle bound
	case <-ctx.Done():
		t.Fatal("the spare global wait was not cancelled after the idle bound")
	}
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := natssem.ForceDelete(ctx, nc, "handed"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.p.Done():
	case <-ctx.Done():
		t.Fatal("the holder of the lost global permit was never told")
	}
	if err := r.p.Err(); !errors.Is(err, tokensem.ErrLeaseLost) {
		t.Errorf("the holder's Err after the loss: %v, want ErrLeaseLost", err)
	}
	g.open()
	if err := r.p.Release(ctx); !errors.Is(err, tokensem.ErrLeaseLost) {
		t.Errorf("Release after the loss: %v, want ErrLeaseLost", err)
	}
}

// TestBlockAttackForceDeleteChurn: callers of two blocks churn (handoffs,
// idle timers, cancellations) while the global semaphore is force-deleted
// under them. Every holder is told (ErrLeaseLost), never two callers on
// one global slot, no Acquire that starts after the ForceDelete returned
// gets a permit, a failed Acquire whose ctx is live never says it was
// cancelled, and no goroutine is left behind.
func TestBlockAttackForceDeleteChurn(t *testing.T) {
	t.Parallel() // each on a server of its own
	srv := startNATS(t)
	const n, lease = 2, 500 * time.Millisecond
	gs := globalSem(t, srv, "fd", n, 2, natssem.WithLease(lease))
	blocks := []*tokensem.Block{
		newBlock(t, gs[0], tokensem.WithBlockIdle(time.Millisecond), tokensem.WithBlockReuse(3)),
		newBlock(t, gs[1], tokensem.WithBlockIdle(0), tokensem.WithBlockReuse(2)),
	}
	ctx := bounded(t)
	meter, e := newHolders(n), &errs{}
	stop := make(chan struct{})
	var lost atomic.Int64
	var deleted atomic.Bool
	var all []tokensem.Permit
	var allMu sync.Mutex
	var ws []*worker
	for i := range 12 {
		b := blocks[i%2]
		hold := 3 * time.Millisecond
		if i%3 == 0 {
			hold = 60 * time.Millisecond
		}
		ws = append(ws, &worker{name: fmt.Sprintf("b%d.%d", i%2, i), sem: b, block: b, meter: meter, errs: e, loss: true,
			stop: stop, holdMax: hold, lost: &lost, afterDelete: &deleted, all: &all, allMu: &allMu})
	}
	// One caller of the first block holds through the delete: it must be
	// told (its Done closes with ErrLeaseLost).
	keeper, err := blocks[0].Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	meter.enter("keeper", keeper)
	var wg sync.WaitGroup
	for i, w := range ws {
		wg.Go(func() { w.run(ctx, uint64(1000+i)) })
	}
	time.Sleep(400 * time.Millisecond)
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	start := time.Now()
	if err := natssem.ForceDelete(ctx, nc, "fd"); err != nil {
		t.Fatal(err)
	}
	deleted.Store(true)
	t.Logf("ForceDelete took %v", time.Since(start).Round(time.Millisecond))
	if !closed(keeper.Done()) || !errors.Is(keeper.Err(), tokensem.ErrLeaseLost) {
		t.Errorf("the block's holder, when the ForceDelete returned: Done closed %v, Err %v; want closed, ErrLeaseLost", closed(keeper.Done()), keeper.Err())
	}
	meter.leave(keeper)
	if err := keeper.Release(ctx); !errors.Is(err, tokensem.ErrLeaseLost) {
		t.Errorf("Release after the loss: %v, want ErrLeaseLost", err)
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	for _, b := range blocks {
		_ = b.Close()
	}
	meter.check(t)
	e.check(t)
	allMu.Lock()
	defer allMu.Unlock()
	for _, p := range all {
		if !closed(p.Done()) || p.Err() == nil {
			t.Errorf("a permit handed out is neither released nor lost: %v (fence %d), Err %v", p.Token(), p.Fence(), p.Err())
		}
	}
	t.Logf("%d permits handed out, %d holds ended by the loss", len(all), lost.Load())
}

// TestBlockAttackPausedBlock: a block whose link to the broker stalls
// past the lease (its global permits are lost) while its callers churn
// (handing releases on in the block), and a block on a healthy link that
// takes the slots the stalled one lost. The stalled block's callers are
// told before any caller of the other gets their slots (Done closed by
// then), never more holders than permits, and after the link comes back
// every global permit returns.
func TestBlockAttackPausedBlock(t *testing.T) {
	t.Parallel() // each on a server of its own
	srv := startNATS(t)
	const n, lease = 2, 2 * time.Second
	name := "paused"
	gs := globalSem(t, srv, name, n, 1, natssem.WithLease(lease))
	px, ps := openProxied(t, srv, name)

	var phase atomic.Int32 // 0 before the stall, 1 during, 2 after
	stalled := newBlock(t, ps, tokensem.WithBlockIdle(time.Second), tokensem.WithBlockReuse(1000))
	healthy := newBlock(t, gs[0], tokensem.WithBlockIdle(0), tokensem.WithBlockReuse(2))
	ctx := bounded(t)
	meter, e := newHolders(n), &errs{}
	stop := make(chan struct{})
	var lost atomic.Int64
	var ws []*worker
	for i := range 10 {
		b, label := stalled, "stalled"
		if i%2 == 1 {
			b, label = healthy, "healthy"
		}
		hold := 3 * time.Millisecond
		if label == "stalled" {
			hold = 40 * time.Millisecond // most of the time, the stalled block's slot is held
		}
		ws = append(ws, &worker{name: fmt.Sprintf("%s%d", label, i), sem: b, block: b, meter: meter, errs: e, loss: true,
			stop: stop, holdMax: hold, lost: &lost, phase: &phase, label: label})
	}

	// One caller of the stalled block holds through the stall: it must be
	// told, and its slot must go to the healthy block only after.
	keeper, err := stalled.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	meter.enter("keeper", keeper)

	var wg sync.WaitGroup
	for i, w := range ws {
		wg.Go(func() { w.run(ctx, uint64(2000+i)) })
	}
	time.Sleep(500 * time.Millisecond)
	phase.Store(1)
	px.Pause()
	select {
	case <-keeper.Done():
	case <-ctx.Done():
		t.Fatal("the stalled block's holder was never told of its loss")
	}
	if !errors.Is(keeper.Err(), tokensem.ErrLeaseLost) {
		t.Errorf("the stalled block's holder: Err %v, want ErrLeaseLost", keeper.Err())
	}
	// Let the healthy block take the stalled one's slots (a lease after
	// their last renewal, by the server's clock).
	time.Sleep(lease + lease/2)
	px.Resume()
	phase.Store(2)
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()
	meter.leave(keeper)
	if err := keeper.Release(ctx); !errors.Is(err, tokensem.ErrLeaseLost) {
		t.Errorf("Release after the loss: %v, want ErrLeaseLost", err)
	}
	_ = stalled.Close()
	_ = healthy.Close()
	meter.check(t)
	e.check(t)
	var ops int64
	for _, w := range ws {
		ops += w.ops.Load()
	}
	t.Logf("%d calls, %d holds ended by the loss, most holders at once %d of %d", ops, lost.Load(), meter.max, n)
	drained(t, gs[0], n)
}

// lateReturn is a real natssem semaphore whose Acquire, before it returns
// a permit, runs before: the goroutine that called it stalled (descheduled
// on a busy machine, a GC pause) between the broker's answer and its next
// step.
type lateReturn struct {
	*natssem.Semaphore
	before func(tokensem.Permit)
}

func (s *lateReturn) Acquire(ctx context.Context) (tokensem.Permit, error) {
	p, err := s.Semaphore.Acquire(ctx)
	if p != nil && s.before != nil {
		s.before(p)
	}
	return p, err
}

// TestBlockAttackAcquiredPermitLostBeforeTaken: a caller's global Acquire
// returns a permit, and the permit is lost (its link stalls past the
// lease) before the block takes it in. The block must not hand the caller
// a permit that believes it holds (Err nil, Done open): the global permit
// was lost before Acquire returned. (A free permit and one handed on by a
// release are checked for loss before they are handed out; this one is
// not.)
func TestBlockAttackAcquiredPermitLostBeforeTaken(t *testing.T) {
	t.Parallel() // each on a server of its own
	srv := startNATS(t)
	const lease = 500 * time.Millisecond
	name := "late"
	globalSem(t, srv, name, 1, 1, natssem.WithLease(lease))
	px, ps := openProxied(t, srv, name)
	ctx := bounded(t)
	// armed: the next global permit acquired is lost before the block
	// takes it in; lostFence is its fence.
	var armed atomic.Bool
	var lostFence atomic.Uint64
	g := &lateReturn{Semaphore: ps, before: func(p tokensem.Permit) {
		if !armed.CompareAndSwap(true, false) {
			return
		}
		px.Pause()
		defer px.Resume()
		select {
		case <-p.Done():
			lostFence.Store(p.Fence())
		case <-ctx.Done():
		}
	}}
	b := newBlock(t, g, tokensem.WithBlockIdle(0), tokensem.WithBlockReuse(1))
	believed := 0
	const rounds = 3
	for range rounds {
		lostFence.Store(0)
		armed.Store(true)
		p, err := b.Acquire(ctx)
		if err != nil {
			t.Logf("Acquire: %v", err)
			continue
		}
		if lostFence.Load() == 0 {
			t.Fatal("the global permit was not lost")
		}
		perr, open := p.Err(), !closed(p.Done())
		if p.Fence() != lostFence.Load() {
			// Another global permit, acquired after the lost one: it
			// must be held.
			if perr != nil || !open {
				t.Errorf("Acquire returned a permit that is not held: Err %v", perr)
			}
			if err := p.Release(ctx); err != nil {
				t.Errorf("Release: %v", err)
			}
			continue
		}
		if perr == nil || open {
			believed++
			t.Errorf("Acquire returned a permit with Err %v, Done open %v, although its global permit (fence %d) was lost before Acquire returned",
				perr, open, p.Fence())
		}
		select {
		case <-p.Done():
		case <-ctx.Done():
			t.Fatal("the permit, whose global permit was lost, was never told")
		}
		if err := p.Release(ctx); !errors.Is(err, tokensem.ErrLeaseLost) {
			t.Errorf("Release after the loss: %v, want ErrLeaseLost", err)
		}
	}
	t.Logf("%d of %d permits lost before Acquire returned were handed out as held", believed, rounds)
}

// TestBlockAttackLossDuringHandoffs: the natural form of
// TestBlockAttackHandedPermitLost, without a slowed Acquire. One global
// permit circulates among a block's callers by handoffs (each releases at
// once, others always wait, with live contexts) when the block's link
// stalls past the lease: the permit is lost at a moment the handoffs do not
// choose, often while it is handed to a waiter that has not yet taken it.
// No caller may be told context.Canceled while its ctx is live, none may
// hold with its permit's Done open once the permit is lost, and the permit
// comes back when the link does.
func TestBlockAttackLossDuringHandoffs(t *testing.T) {
	t.Parallel() // each on a server of its own
	srv := startNATS(t)
	const lease = 500 * time.Millisecond
	name := "handoffs"
	direct := globalSem(t, srv, name, 1, 1, natssem.WithLease(lease))[0]
	px, ps := openProxied(t, srv, name)
	b := newBlock(t, ps, tokensem.WithBlockIdle(time.Second), tokensem.WithBlockReuse(1_000_000))
	ctx := bounded(t)
	meter, e := newHolders(1), &errs{}
	stop := make(chan struct{})
	var handoffs atomic.Int64
	var wg sync.WaitGroup
	for i := range 6 {
		who := fmt.Sprintf("c%d", i)
		wg.Go(func() {
			for !closed(stop) {
				p, err := b.Acquire(ctx)
				if err != nil {
					if isCtxErr(err) && err != ctx.Err() {
						e.wrong("%s: Acquire returned %v, but its ctx's Err is %v", who, err, ctx.Err())
					}
					e.add(kindOf(err))
					continue
				}
				meter.enter(who, p)
				handoffs.Add(1)
				lost := closed(p.Done())
				meter.leave(p)
				rerr := p.Release(ctx)
				switch {
				case rerr == nil:
					e.add("held")
				case errors.Is(rerr, tokensem.ErrLeaseLost):
					e.add("held, then lost")
				default:
					e.wrong("%s: Release: %v", who, rerr)
				}
				if lost {
					e.add("handed out lost")
				}
			}
		})
	}
	// Two callers that only try: each waits in the block while its
	// global TryAcquire is under way (long, on the stalled link), so a
	// release may hand it the permit too.
	for i := range 2 {
		who := fmt.Sprintf("try%d", i)
		wg.Go(func() {
			for !closed(stop) {
				p, err := b.TryAcquire(ctx)
				if err != nil {
					if isCtxErr(err) && err != ctx.Err() {
						e.wrong("%s: TryAcquire returned %v, but its ctx's Err is %v", who, err, ctx.Err())
					}
					if errors.Is(err, tokensem.ErrNoPermit) {
						e.add("try: nopermit")
					} else {
						e.add("try: " + kindOf(err))
					}
					time.Sleep(time.Millisecond)
					continue
				}
				meter.enter(who, p)
				handoffs.Add(1)
				meter.leave(p)
				if rerr := p.Release(ctx); rerr != nil && !errors.Is(rerr, tokensem.ErrLeaseLost) {
					e.wrong("%s: Release: %v", who, rerr)
				}
				e.add("try: held")
			}
		})
	}
	for range 3 {
		time.Sleep(200 * time.Millisecond)
		px.Pause()
		time.Sleep(lease) // past the permit's deadline (lease - lease/5 after its last renewal)
		px.Resume()
	}
	time.Sleep(200 * time.Millisecond)
	close(stop)
	wg.Wait()
	_ = b.Close()
	meter.check(t)
	e.check(t)
	t.Logf("%d holds", handoffs.Load())
	drained(t, direct, 1)
}

// openProxied opens semaphore name on srv through a fault proxy of its
// own, which the test may pause (and which is resumed when it ends).
func openProxied(t *testing.T, srv *embedded.Server, name string) (*faultproxy.Proxy, *natssem.Semaphore) {
	t.Helper()
	px, err := faultproxy.New(srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = px.Close() })
	pnc, err := nats.Connect("nats://" + px.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pnc.Close)
	ps, err := natssem.Open(bounded(t), pnc, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ps.Close() })
	t.Cleanup(px.Resume)
	return px, ps
}

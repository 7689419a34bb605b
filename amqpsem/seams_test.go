package amqpsem_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/amqpsem"
	"github.com/tokensem/tokensem/internal/faultproxy"
	"github.com/tokensem/tokensem/internal/semtest"
	"github.com/tokensem/tokensem/reconciler"
)

// The seams: a slot must never have two valid holders, and its fences
// never go back, across the copies a repair makes, the orphans that
// return, and the lives of a name (Delete, then Init). These tests stall a
// holder's link with a fault proxy (Pause: the process runs, the link is
// silent) while the broker side changes under it.

func claimQueueName(n string, i int) string { return fmt.Sprintf("tokensem.%s.claim.%d", n, i) }

// lossTime records when p's Done closes.
type lossTime struct{ at atomic.Int64 }

func watchLoss(p tokensem.Permit) *lossTime {
	l := &lossTime{}
	go func() { <-p.Done(); l.at.Store(time.Now().UnixNano()) }()
	return l
}

// before fails t unless the loss was seen no later than at.
func (l *lossTime) before(t *testing.T, at time.Time, what string) {
	t.Helper()
	lost := l.at.Load()
	switch {
	case lost == 0:
		t.Fatalf("%s at %v while the stalled holder still held its permit", what, at.Format("15:04:05.000"))
	case lost > at.UnixNano():
		t.Fatalf("%s %v before the stalled holder learned of its loss", what, time.Unix(0, lost).Sub(at))
	}
}

// proxiedOpen opens semaphore n through a new fault proxy in front of the
// test broker, with the default heartbeat.
func proxiedOpen(t *testing.T, n string, opts ...amqpsem.Option) (*faultproxy.Proxy, *amqpsem.Semaphore) {
	t.Helper()
	px, err := faultproxy.New(broker.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = px.Close() })
	s, err := amqpsem.Open(t.Context(), dial(t, px.Addr(), 0), n, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return px, s
}

// TestStalledHolderLosesClaimQueue: the holder's link stalls (its process
// runs, its heartbeat not yet missed) and its slot's claim queue
// disappears, as when the queue's node is lost. A waiter that repairs
// orphans finds the slot without a claim; it must not hold a permit of the
// slot until the stalled holder has given its permit up.
func TestStalledHolderLosesClaimQueue(t *testing.T) {
	t.Parallel()
	n := name(t)
	initAMQP(t, n, 1)
	px, h := proxiedOpen(t, n)
	ph, err := h.Acquire(semtest.Context(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	lost := watchLoss(ph)
	px.Pause()
	defer px.Resume()
	if _, err := rawChannel(t).QueueDelete(claimQueueName(n, 0), false, false, false); err != nil {
		t.Fatal(err)
	}
	w := openAMQP(t, n, amqpsem.WithOrphanRepair(time.Second))
	start := time.Now()
	pw, err := w.Acquire(semtest.Context(t, time.Minute))
	got := time.Now()
	if err != nil {
		t.Fatalf("the waiter got no permit: %v", err)
	}
	t.Logf("waiter's permit after %v (fence %d); holder lost after %v: %v", got.Sub(start).Round(time.Millisecond),
		pw.Fence(), time.Unix(0, lost.at.Load()).Sub(start).Round(time.Millisecond), ph.Err())
	lost.before(t, got, "the waiter held the slot")
	if pw.Fence() <= ph.Fence() {
		t.Errorf("the waiter's fence %d is not above the stalled holder's %d", pw.Fence(), ph.Fence())
	}
	px.Resume()
	if err := pw.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// TestFencesNeverGoBack: the only token is orphaned; a waiter's repair
// issues a copy, which is held and released; then the orphan returns. The
// fences of the slot's successive holders must keep growing, through a
// reconcile that removes one of the two tokens.
func TestFencesNeverGoBack(t *testing.T) {
	t.Parallel()
	n := name(t)
	admin := initAMQP(t, n, 1)
	giveBack := orphan(t, n)
	s := openAMQP(t, n, amqpsem.WithOrphanRepair(time.Second))
	var fences []uint64
	take := func(what string) {
		t.Helper()
		p, err := s.Acquire(semtest.Context(t, time.Minute))
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		fences = append(fences, p.Fence())
		if err := p.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	take("acquire while the only token is orphaned")
	giveBack()
	for i := range 6 {
		if i == 3 {
			if _, err := reconciler.Run(t.Context(), admin.Inventory(), true); err != nil {
				t.Fatal(err)
			}
		}
		take(fmt.Sprintf("acquire %d after the orphan returned", i))
	}
	t.Logf("fences: %v", fences)
	for i := 1; i < len(fences); i++ {
		if fences[i] <= fences[i-1] {
			t.Fatalf("holder %d's fence %d is not above holder %d's %d (all: %v)", i, fences[i], i-1, fences[i-1], fences)
		}
	}
	st, err := admin.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st.Tokens != 1 || !st.Healthy {
		t.Fatalf("status after the orphan returned: %+v", st)
	}
}

// TestForceDeleteReachesStalledHolderLate: ForceDelete and a new Init of
// the name while a holder's link stalls; the holder hears of the delete
// when its link returns, right after the new Init. A holder of the new
// life must not exist while the old holder still holds, the old holder
// must not keep its permit into the new life, and the new life's fences
// start above the old one's.
func TestForceDeleteReachesStalledHolderLate(t *testing.T) {
	t.Parallel()
	n := name(t)
	c := dial(t, broker.Addr, 0)
	s1, err := amqpsem.Init(t.Context(), c, n, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer s1.Close()
	t.Cleanup(func() { _ = amqpsem.ForceDelete(semtest.CleanupContext(t, time.Minute), c, n) })
	px, h := proxiedOpen(t, n)
	ph, err := h.Acquire(semtest.Context(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	lost := watchLoss(ph)
	px.Pause()
	start := time.Now()
	if err := amqpsem.ForceDelete(semtest.Context(t, time.Minute), c, n); err != nil {
		t.Fatal(err)
	}
	s2, err := amqpsem.Init(semtest.Context(t, time.Minute), c, n, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	px.Resume() // the old holder hears of the delete now
	w := openAMQP(t, n)
	pw, err := w.Acquire(semtest.Context(t, 30*time.Second))
	got := time.Now()
	if err != nil {
		t.Fatalf("no permit of the new life: %v (the old holder: %v)", err, ph.Err())
	}
	t.Logf("new life's permit after %v (fence %d); old holder (fence %d) lost after %v: %v", got.Sub(start).Round(time.Millisecond),
		pw.Fence(), ph.Fence(), time.Unix(0, lost.at.Load()).Sub(start).Round(time.Millisecond), ph.Err())
	lost.before(t, got, "a holder of the new life held the slot")
	if pw.Fence() <= ph.Fence() {
		t.Errorf("the new life's fence %d is not above the old life's %d", pw.Fence(), ph.Fence())
	}
	if err := pw.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// TestFencesGrowAcrossLives: Delete, then Init of the same name: the new
// life's fences start above every fence of the old one.
func TestFencesGrowAcrossLives(t *testing.T) {
	t.Parallel()
	n := name(t)
	c := dial(t, broker.Addr, 0)
	var last uint64
	for life := range 3 {
		s, err := amqpsem.Init(t.Context(), c, n, 1)
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			p, err := s.Acquire(semtest.Context(t, 10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if p.Fence() <= last {
				t.Fatalf("life %d: fence %d is not above %d", life, p.Fence(), last)
			}
			last = p.Fence()
			if err := p.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		_ = s.Close()
		if err := amqpsem.Delete(semtest.Context(t, time.Minute), c, n); err != nil {
			t.Fatal(err)
		}
	}
}

// holdLock takes semaphore n's creation lock from a plain connection (the
// lock is an exclusive queue), retrying while another connection holds
// it; the lock is held until the test ends.
func holdLock(t *testing.T, n string) {
	t.Helper()
	conn, err := amqp.Dial(broker.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	deadline := time.Now().Add(20 * time.Second)
	for {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if _, err = ch.QueueDeclare("tokensem."+n+".lock", false, false, true, false, nil); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("taking the lock: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// queueExists reports whether queue q exists.
func queueExists(t *testing.T, conn *amqp.Connection, q string) bool {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	_, err = ch.QueueDeclarePassive(q, false, false, false, false, nil)
	if err == nil {
		_ = ch.Close()
		return true
	}
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.NotFound {
		t.Fatal(err)
	}
	return false
}

// TestDeleteStopsWhenItsLockIsLost: a Delete's connection is cut while it
// removes the semaphore's queues; the Conn reconnects at once. The lock
// (an exclusive queue) went with the connection and is taken by someone
// else: the Delete must not remove anything more while the other holds the
// lock. Whether the cut meets a call in flight (which fails) or falls
// between two calls (the next one opens a channel on the new connection)
// is chance, so the test cuts several deletes.
func TestDeleteStopsWhenItsLockIsLost(t *testing.T) {
	t.Parallel()
	const rounds, permits = 5, 80
	conn, err := amqp.Dial(broker.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for r := range rounds {
		n := fmt.Sprintf("%s-%d", name(t), r)
		initAMQP(t, n, permits)
		px, err := faultproxy.New(broker.Addr)
		if err != nil {
			t.Fatal(err)
		}
		defer px.Close()
		c := dial(t, px.Addr(), 0)
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- amqpsem.Delete(ctx, c, n) }()
		// Cut once the deletion of the queues is under way: the token
		// queue goes before the claim queues.
		deadline := time.Now().Add(30 * time.Second)
		for queueExists(t, conn, amqpsem.ResourcesOf(n).Queue) {
			if time.Now().After(deadline) {
				t.Fatal("the token queue was never deleted")
			}
			time.Sleep(time.Millisecond)
		}
		px.Cut()
		holdLock(t, n)
		snapshot := func() []bool {
			out := make([]bool, permits)
			for i := range out {
				out[i] = queueExists(t, conn, claimQueueName(n, i))
			}
			return out
		}
		before := snapshot()
		time.Sleep(time.Second)
		after := snapshot()
		removed, existed := 0, 0
		for i := range before {
			if before[i] {
				existed++
			}
			if before[i] && !after[i] {
				removed++
			}
		}
		if removed > 0 {
			t.Fatalf("round %d: the Delete removed %d claim queues after its lock was lost and taken by another", r, removed)
		}
		t.Logf("round %d: %d claim queues left when the lock was taken, none removed since", r, existed)
		cancel()
		<-done
		// The cut Delete leaves claim queues no later Delete of the name
		// finds (its configuration is gone): removed here, as the broker
		// outlives the run.
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		for i := range permits {
			if _, err := ch.QueueDelete(claimQueueName(n, i), false, false, false); err != nil {
				t.Fatalf("deleting what the test left: %v", err)
			}
		}
		_ = ch.Close()
	}
}

// TestReconcileStopsWhenItsLockIsLost: a repair's connection is cut while
// it is about to issue tokens for missing slots; the Conn reconnects at
// once and someone else takes the lock. The repair must not publish
// anything after the loss.
func TestReconcileStopsWhenItsLockIsLost(t *testing.T) {
	t.Parallel()
	n := name(t)
	admin := initAMQP(t, n, 3)
	for range 3 {
		orphan(t, n) // every token checked out, none claimed: all three missing
	}
	px, s := proxiedOpen(t, n)
	_ = admin
	done := make(chan error, 1)
	go func() {
		_, err := reconciler.Run(semtest.Context(t, time.Minute), s.Inventory(), true)
		done <- err
	}()
	time.Sleep(300 * time.Millisecond) // the census is over, the issue waits
	px.Cut()
	holdLock(t, n)
	ch := rawChannel(t)
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		q, err := ch.QueueDeclarePassive(amqpsem.ResourcesOf(n).Queue, true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if q.Messages > 0 {
			t.Fatalf("%d tokens published after the repair's lock was lost and taken by another", q.Messages)
		}
	}
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the repair succeeded after its lock was lost")
		}
		t.Logf("the repair returned: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the repair goes on after its lock was lost")
	}
}

// hog keeps every CPU busy until the test ends.
func hog(t *testing.T) {
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	for range 4 {
		go func() {
			x := 0
			for {
				select {
				case <-stop:
					return
				default:
				}
				for i := 0; i < 1e5; i++ {
					x += i
				}
			}
		}()
	}
}

// cancelSlack is how long after its ctx's deadline an Acquire, TryAcquire
// or Do may return, beyond the time the Go scheduler itself takes to wake
// a goroutine whose timer fired (measured alongside, on the same loaded
// machine): amqpsem waits for nothing once ctx has ended.
const cancelSlack = 150 * time.Millisecond

// TestCancelledWaitReturnsCtxErr: an Acquire, TryAcquire or Do whose
// deadline passes returns ctx.Err() itself, not an error wrapping it, and
// returns within cancelSlack of the deadline plus the scheduler's delay,
// under CPU load, whatever step the deadline interrupts (opening a
// channel, reading the configuration, waiting for a token).
func TestCancelledWaitReturnsCtxErr(t *testing.T) {
	n := name(t)
	admin := initAMQP(t, n, 1)
	held, err := admin.Acquire(semtest.Context(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(context.Background())
	c := dial(t, broker.Addr, 0)
	hog(t)
	// The scheduler's own delay under this load: how late a goroutine
	// waiting on a bare context's 3 ms deadline wakes up (the context's
	// timer runs its cancel in a goroutine of its own, which must be
	// scheduled first), at worst over the whole test.
	var bare atomic.Int64
	stopBare := make(chan struct{})
	defer close(stopBare)
	go func() {
		for {
			select {
			case <-stopBare:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Millisecond)
			start := time.Now()
			<-ctx.Done()
			if late := int64(time.Since(start) - 3*time.Millisecond); late > bare.Load() {
				bare.Store(late)
			}
			cancel()
		}
	}()
	deadlines := []time.Duration{time.Millisecond, 3 * time.Millisecond, 10 * time.Millisecond, 30 * time.Millisecond, 250 * time.Millisecond}
	var wrong, late, calls int
	var worst time.Duration
	type lateCall struct {
		d    time.Duration
		call int
		over time.Duration
	}
	var overs []lateCall
	for i := range 24 {
		// A fresh handle now and then: its first call opens channels and
		// reads the configuration.
		s, err := amqpsem.Open(t.Context(), c, n)
		if err != nil {
			t.Fatal(err)
		}
		for j, d := range deadlines {
			ctx, cancel := context.WithTimeout(t.Context(), d)
			start := time.Now()
			switch (i + j) % 3 {
			case 0:
				_, err = s.Acquire(ctx)
			case 1:
				_, err = s.TryAcquire(ctx)
				if errors.Is(err, tokensem.ErrNoPermit) {
					cancel()
					continue // answered before the deadline
				}
			case 2:
				err = tokensem.Do(ctx, s, func(context.Context) error { return nil })
			}
			over := time.Since(start) - d
			calls++
			if err != ctx.Err() || err == nil {
				wrong++
				t.Errorf("deadline %v, call %d: err = %v (%T), want ctx.Err() itself", d, (i+j)%3, err, err)
			}
			overs = append(overs, lateCall{d, (i + j) % 3, over})
			worst = max(worst, over)
			cancel()
		}
		_ = s.Close()
	}
	sched := time.Duration(bare.Load())
	for _, o := range overs {
		if o.over > sched+cancelSlack {
			late++
			t.Errorf("deadline %v, call %d: returned %v after it (a bare context wait woke up to %v late)",
				o.d, o.call, o.over.Round(time.Millisecond), sched.Round(time.Millisecond))
		}
	}
	t.Logf("%d calls: %d with a wrong error, %d late; worst %v after the deadline (a bare context wait woke up to %v late)",
		calls, wrong, late, worst.Round(time.Millisecond), time.Duration(bare.Load()).Round(time.Millisecond))
}

// TestAbandonedInitLeavesNoLock: an Init whose ctx ends while its
// declare of the creation lock (an exclusive queue) is on its way must not
// leave the lock held by its connection once the declare lands: every
// other connection's Init, Resize, reconcile and Delete of the name would
// wait for it as long as that connection lives. Deadlines from 0 to 11 ms
// put the end of ctx at every step of an Init; after each, the lock queue
// must be gone soon after (15 s at most), as another connection sees it.
func TestAbandonedInitLeavesNoLock(t *testing.T) {
	t.Parallel()
	c := dial(t, broker.Addr, 0)
	conn, err := amqp.Dial(broker.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	// lockState tells the lock queue of n apart: absent, or held by another
	// connection (405 on a passive declare).
	locked := func(n string) bool {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		_, err = ch.QueueDeclarePassive("tokensem."+n+".lock", false, false, true, false, nil)
		var ae *amqp.Error
		switch {
		case err == nil:
			_ = ch.Close()
			t.Fatalf("the lock queue of %s is open to any connection", n)
		case errors.As(err, &ae) && ae.Code == amqp.ResourceLocked:
			return true
		case errors.As(err, &ae) && ae.Code == amqp.NotFound:
			return false
		}
		t.Fatal(err)
		return false
	}
	base := name(t)
	leaked := 0
	for i := range 12 {
		n := fmt.Sprintf("%s-%d", base, i)
		ctx, cancel := context.WithTimeout(t.Context(), time.Duration(i)*time.Millisecond)
		s, err := amqpsem.Init(ctx, c, n, 1)
		cancel()
		if err == nil {
			_ = s.Close()
		}
		t.Cleanup(func() { _ = amqpsem.ForceDelete(semtest.CleanupContext(t, time.Minute), c, n) })
		// The undo deletes the lock when the broker answers the declare
		// Init gave up on, and that answer may come after Init returned:
		// the queue can appear a moment after Init and go again (a first
		// "absent" proves nothing). Wait for it to stay absent for half a
		// second; a leaked lock stays until its connection closes, so it
		// is still there after 15 s.
		deadline, absentSince, gone := time.Now().Add(15*time.Second), time.Time{}, false
		for !gone && time.Now().Before(deadline) {
			switch {
			case locked(n):
				absentSince = time.Time{}
			case absentSince.IsZero():
				absentSince = time.Now()
			default:
				gone = time.Since(absentSince) > 500*time.Millisecond
			}
			time.Sleep(10 * time.Millisecond)
		}
		if !gone {
			leaked++
			t.Errorf("Init with a %d ms deadline (%v) left the lock of %s held by its connection", i, err, n)
		}
	}
	if leaked > 0 {
		t.Logf("%d of 12 abandoned Inits left the lock held", leaked)
	}
}

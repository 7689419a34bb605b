package amqpsem_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tokensem/tokensem/amqpsem"
	"github.com/tokensem/tokensem/internal/semtest"
	"github.com/tokensem/tokensem/reconciler"
)

// orphan takes one token of semaphore n on a raw channel and keeps it
// unacknowledged without claiming its slot, as RabbitMQ 3.10 keeps the
// token of a consumer on a lost node after a queue leader's loss. The
// returned func closes the channel, which returns the token.
func orphan(t *testing.T, n string) (giveBack func()) {
	t.Helper()
	ch := rawChannel(t)
	if _, ok, err := ch.Get(amqpsem.ResourcesOf(n).Queue, false); err != nil || !ok {
		t.Fatalf("taking a token to orphan it: ok %v, %v", ok, err)
	}
	return func() { _ = ch.Close() }
}

func openAMQP(t *testing.T, n string, opts ...amqpsem.Option) *amqpsem.Semaphore {
	t.Helper()
	s, err := amqpsem.Open(t.Context(), dial(t, broker.Addr, 0), n, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestOrphanRepair: the only token is checked out to a consumer that never
// gives it back. A waiter repairs that once it has waited the orphan
// check's interval (and the repair has held the slot for W), and gets a
// permit; the orphan that returns later is retired by the repair's copy:
// it admits no one, and whoever meets it first (a waiter, or a reconcile)
// removes it.
func TestOrphanRepair(t *testing.T) {
	t.Parallel()
	n := name(t)
	admin := initAMQP(t, n, 1)
	giveBack := orphan(t, n)
	s := openAMQP(t, n, amqpsem.WithOrphanRepair(time.Second))
	start := time.Now()
	p, err := s.Acquire(semtest.Context(t, 30*time.Second))
	if err != nil {
		t.Fatalf("acquire while the only token is orphaned: %v", err)
	}
	t.Logf("permit after %v (fence %d)", time.Since(start).Round(time.Millisecond), p.Fence())

	giveBack()
	other := openAMQP(t, n, amqpsem.WithOrphanRepair(0))
	if q, err := other.Acquire(semtest.Context(t, 2*time.Second)); !errors.Is(err, context.DeadlineExceeded) {
		if q != nil {
			_ = q.Release(t.Context())
		}
		t.Fatalf("a second holder through the returned orphan while the repair's token is held: %v", err)
	}
	if err := p.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	rep, err := reconciler.Run(t.Context(), admin.Inventory(), true)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Duplicates) != 0 || rep.Removed > 1 || !rep.Healthy {
		t.Fatalf("reconcile after the orphan returned: %+v; want it healthy, the orphan removed if the waiter did not", rep)
	}
	st, err := admin.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st.Tokens != 1 || st.Available != 1 {
		t.Fatalf("status after the reconcile: %+v", st)
	}
}

// TestOrphanRepairOff: with the check off, the waiter of TestOrphanRepair
// waits out its deadline (what every waiter did before the check).
func TestOrphanRepairOff(t *testing.T) {
	t.Parallel()
	n := name(t)
	initAMQP(t, n, 1)
	orphan(t, n)
	s := openAMQP(t, n, amqpsem.WithOrphanRepair(0))
	if p, err := s.Acquire(semtest.Context(t, 3*time.Second)); !errors.Is(err, context.DeadlineExceeded) {
		if p != nil {
			_ = p.Release(t.Context())
		}
		t.Fatalf("acquire with the only token orphaned and no check: %v; want the deadline", err)
	}
}

// TestOrphanCheckLeavesHeldSlots: waiters behind holders that keep every
// slot run several checks and issue nothing.
func TestOrphanCheckLeavesHeldSlots(t *testing.T) {
	t.Parallel()
	n := name(t)
	admin := initAMQP(t, n, 2)
	for range 2 {
		p, err := admin.Acquire(semtest.Context(t, 5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer p.Release(context.Background())
	}
	for range 2 {
		s := openAMQP(t, n, amqpsem.WithOrphanRepair(time.Second))
		if p, err := s.Acquire(semtest.Context(t, 4*time.Second)); !errors.Is(err, context.DeadlineExceeded) {
			if p != nil {
				_ = p.Release(t.Context())
			}
			t.Fatalf("a waiter behind two holders of two permits: %v; want the deadline", err)
		}
	}
	st, err := admin.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st.Tokens != 2 || st.Held != 2 || len(st.Duplicate) != 0 {
		t.Fatalf("status after the waiters' checks: %+v; want 2 tokens, both held, no copies", st)
	}
}

func TestWithOrphanRepairValidates(t *testing.T) {
	for _, d := range []time.Duration{-time.Second, time.Millisecond, 999 * time.Millisecond} {
		if _, err := amqpsem.Open(t.Context(), dial(t, broker.Addr, 0), "any", amqpsem.WithOrphanRepair(d)); err == nil {
			t.Errorf("WithOrphanRepair(%v) accepted", d)
		}
	}
}

package tokensem_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/semtest"
	"github.com/tokensem/tokensem/natssem"
	"github.com/tokensem/tokensem/natssem/embedded"
)

// unnamed is a Semaphore without a Name method: AcquireAll cannot order it.
type unnamed struct{ tokensem.Semaphore }

func TestAcquireAllOrder(t *testing.T) {
	s := newSem(t, 2)
	for _, tc := range []struct {
		name string
		sems []tokensem.Semaphore
		want error
	}{
		{"none", nil, tokensem.ErrInvalidOption},
		{"twice", []tokensem.Semaphore{s, s}, tokensem.ErrAmbiguousOrder},
		{"unnamed", []tokensem.Semaphore{s, unnamed{s}}, tokensem.ErrAmbiguousOrder},
		{"nil", []tokensem.Semaphore{s, nil}, tokensem.ErrAmbiguousOrder},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := tokensem.AcquireAll(bounded(t), tc.sems...); !errors.Is(err, tc.want) {
				t.Fatalf("AcquireAll: %v, want %v", err, tc.want)
			}
			if _, err := tokensem.TryAcquireAll(bounded(t), tc.sems...); !errors.Is(err, tc.want) {
				t.Fatalf("TryAcquireAll: %v, want %v", err, tc.want)
			}
		})
	}
	if got := available(t, s); got != 2 {
		t.Fatalf("%d permits available after refused calls, want 2", got)
	}
}

// TestPermitSetLoss: a member that ends on its own is the loss of the set;
// the set hands the other permits back without being asked.
func TestPermitSetLoss(t *testing.T) {
	s := newSem(t, 3)
	a, b := hold(t, s), hold(t, s)
	set := tokensem.NewPermitSet(a, b)
	if set.Len() != 2 || set.Fences()[0] != a.Fence() || set.Tokens()[1] != b.Token() {
		t.Fatalf("set %v fences %v: not the permits given, in order", set.Tokens(), set.Fences())
	}
	if set.Deadline().IsZero() {
		t.Fatal("a set of natssem permits has no deadline")
	}
	if err := a.Release(bounded(t)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-set.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed after a member ended")
	}
	if !errors.Is(set.Err(), tokensem.ErrLeaseLost) {
		t.Fatalf("Err = %v, want ErrLeaseLost", set.Err())
	}
	waitFor(t, "the other member handed back", func() bool { return b.Err() != nil })
	if err := set.Release(bounded(t)); !errors.Is(err, tokensem.ErrLeaseLost) {
		t.Fatalf("Release after the loss: %v", err)
	}
	waitFor(t, "all 3 permits free", func() bool { return available(t, s) == 3 })
}

// TestPermitSetReleaseTwice: Release returns every member once; a second
// call says ErrReleased; an empty set is held until released.
func TestPermitSetReleaseTwice(t *testing.T) {
	s := newSem(t, 2)
	set := tokensem.NewPermitSet(hold(t, s), hold(t, s))
	if err := set.Release(bounded(t)); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(set.Err(), tokensem.ErrReleased) {
		t.Fatalf("Err after Release = %v", set.Err())
	}
	if err := set.Release(bounded(t)); !errors.Is(err, tokensem.ErrReleased) {
		t.Fatalf("second Release: %v", err)
	}
	waitFor(t, "both permits free", func() bool { return available(t, s) == 2 })
	empty := tokensem.NewPermitSet()
	if empty.Err() != nil || empty.Release(bounded(t)) != nil {
		t.Fatal("an empty set is not held and released like any other")
	}
}

func TestDoWithWeight(t *testing.T) {
	s := newSem(t, 3)
	var inside atomic.Int32
	err := tokensem.Do(bounded(t), s, func(ctx context.Context) error {
		inside.Store(int32(3 - available(t, s)))
		return nil
	}, tokensem.WithWeight(3))
	if err != nil {
		t.Fatal(err)
	}
	if inside.Load() != 3 {
		t.Fatalf("%d permits held inside Do(WithWeight(3)), want 3", inside.Load())
	}
	waitFor(t, "all permits back", func() bool { return available(t, s) == 3 })

	p := hold(t, s)
	err = tokensem.Do(bounded(t), s, func(context.Context) error { return nil },
		tokensem.WithWeight(3), tokensem.WithWait(0))
	if !errors.Is(err, tokensem.ErrNoPermit) {
		t.Fatalf("Do(WithWeight(3), WithWait(0)) with 2 free: %v, want ErrNoPermit", err)
	}
	if err := p.Release(bounded(t)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		opts []tokensem.DoOption
		want error
	}{
		{[]tokensem.DoOption{tokensem.WithWeight(0)}, tokensem.ErrInvalidOption},
		{[]tokensem.DoOption{tokensem.WithWeight(4)}, tokensem.ErrWeightExceedsPermits},
	} {
		if err := tokensem.Do(bounded(t), s, func(context.Context) error { return nil }, tc.opts...); !errors.Is(err, tc.want) {
			t.Fatalf("Do: %v, want %v", err, tc.want)
		}
	}
	if err := tokensem.Do(bounded(t), unnamed{s}, func(context.Context) error { return nil }, tokensem.WithWeight(2)); !errors.Is(err, tokensem.ErrInvalidOption) {
		t.Fatalf("Do(WithWeight) on a semaphore that is not Weighted: %v", err)
	}
}

// TestCloseDuringGateCreation: Close while a first AcquireN creates the
// gate on a broker that stopped answering returns at once, and the
// AcquireN returns ErrClosed instead of retrying until its ctx ends.
func TestCloseDuringGateCreation(t *testing.T) {
	srv, err := embedded.Start(embedded.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	nc, err := nats.Connect(srv.URL(), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	s, err := natssem.Init(bounded(t), nc, "gated", 2)
	if err != nil {
		t.Fatal(err)
	}
	srv.Shutdown()
	done := make(chan error, 1)
	go func() {
		_, err := s.AcquireN(semtest.Context(t, time.Minute), 2)
		done <- err
	}()
	time.Sleep(300 * time.Millisecond)
	closed := make(chan struct{})
	go func() { _ = s.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(20 * time.Second):
		t.Fatal("Close still waiting 20 s after it was called, while AcquireN made the gate")
	}
	select {
	case err := <-done:
		if !errors.Is(err, tokensem.ErrClosed) {
			t.Fatalf("AcquireN after Close: %v, want ErrClosed", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("AcquireN still waiting 20 s after Close")
	}
}

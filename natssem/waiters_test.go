package natssem_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/semtest"
	"github.com/tokensem/tokensem/natssem"
)

// TestTooManyWaiters: the waiter cap set at Init is enforced by the server
// and reported as ErrTooManyWaiters, and the refused call strands nothing.
func TestTooManyWaiters(t *testing.T) {
	name := "max-waiters"
	s := initNATS(t, name, 1, natssem.WithMaxWaiters(2), natssem.WithPullHeartbeat(200*time.Millisecond))
	held, err := s.Acquire(semtest.Context(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	errs := make(chan error, 2)
	for range 2 {
		c := openNATS(t, name)
		go func() { _, err := c.Acquire(ctx); errs <- err }()
	}
	cons := rawConsumer(t, name)
	waitFor(t, "two waiters", func() bool {
		info, err := cons.Info(t.Context())
		return err == nil && info.NumWaiting == 2
	})
	third, err := natssem.Open(t.Context(), connect(t, srv.Addr().String()), name, natssem.WithPullHeartbeat(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	_, err = third.Acquire(semtest.Context(t, 5*time.Second))
	if !errors.Is(err, tokensem.ErrTooManyWaiters) {
		t.Fatalf("third waiter: err = %v, want ErrTooManyWaiters", err)
	}
	// TryAcquire does not wait: with the waiter queue full it reports no
	// permit free (see also TestNoWaitPullOnAFullQueue).
	if _, err := third.TryAcquire(semtest.Context(t, 5*time.Second)); !errors.Is(err, tokensem.ErrNoPermit) {
		t.Fatalf("TryAcquire with the waiter queue full: err = %v, want ErrNoPermit", err)
	}
	cancel()
	for range 2 {
		<-errs
	}
	if err := held.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	p, err := s.Acquire(semtest.Context(t, 5*time.Second))
	if err != nil {
		t.Fatalf("permit not free after the refused and cancelled waiters: %v", err)
	}
	_ = p.Release(t.Context())
}

// TestTooManyLocalWaiters: one handle's callers beyond WithMaxLocalWaiters
// are refused at once, leaving the server's places to other clients: a
// waiter of another handle still queues and gets the permit first.
func TestTooManyLocalWaiters(t *testing.T) {
	name := "max-local-waiters"
	s := initNATS(t, name, 1, natssem.WithMaxWaiters(4))
	held, err := s.Acquire(semtest.Context(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	greedy, err := natssem.Open(t.Context(), connect(t, srv.Addr().String()), name, natssem.WithMaxLocalWaiters(2))
	if err != nil {
		t.Fatal(err)
	}
	defer greedy.Close()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	errs := make(chan error, 2)
	for range 2 {
		go func() { _, err := greedy.Acquire(ctx); errs <- err }()
	}
	cons := rawConsumer(t, name)
	waitFor(t, "two waiters", func() bool {
		info, err := cons.Info(t.Context())
		return err == nil && info.NumWaiting == 2
	})
	start := time.Now()
	if _, err := greedy.Acquire(semtest.Context(t, 5*time.Second)); !errors.Is(err, tokensem.ErrTooManyWaiters) {
		t.Fatalf("third waiter of the same handle: err = %v, want ErrTooManyWaiters", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("refused after %v, not at once", d)
	}
	// TryAcquire does not wait, so it is not counted.
	if _, err := greedy.TryAcquire(t.Context()); !errors.Is(err, tokensem.ErrNoPermit) {
		t.Fatalf("TryAcquire beside two waiters: %v", err)
	}
	other := openNATS(t, name)
	got := make(chan error, 1)
	go func() {
		p, err := other.Acquire(semtest.Context(t, 20*time.Second))
		if err == nil {
			err = p.Release(context.Background())
		}
		got <- err
	}()
	waitFor(t, "the other handle's waiter queued", func() bool {
		info, err := cons.Info(t.Context())
		return err == nil && info.NumWaiting == 3
	})
	cancel() // the greedy handle's waiters leave; the other's stays queued
	for range 2 {
		if err := <-errs; !errors.Is(err, context.Canceled) {
			t.Fatalf("greedy waiter: %v", err)
		}
	}
	if err := held.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the other handle's waiter: %v", err)
	}
	if _, err := natssem.Open(t.Context(), connect(t, srv.Addr().String()), name, natssem.WithMaxLocalWaiters(0)); !errors.Is(err, tokensem.ErrInvalidOption) {
		t.Fatalf("WithMaxLocalWaiters(0): %v", err)
	}
}

// TestWaiterOutlivesPullExpiry: a caller that waits longer than one pull
// request lives re-issues it and still gets the permit.
func TestWaiterOutlivesPullExpiry(t *testing.T) {
	t.Parallel()
	name := "pull-expiry"
	s := initNATS(t, name, 1)
	held, err := s.Acquire(semtest.Context(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	w, err := natssem.Open(t.Context(), connect(t, srv.Addr().String()), name, natssem.WithPullExpiry(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	got := make(chan error, 1)
	go func() {
		p, err := w.Acquire(semtest.Context(t, 30*time.Second))
		if err == nil {
			err = p.Release(context.Background())
		}
		got <- err
	}()
	time.Sleep(2500 * time.Millisecond) // two pull expiries
	if err := held.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("waiter after its pulls expired: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waiter never got the permit after its pull expired")
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestGivenUpPullLeavesTheQueue: on a single server a caller that gives up
// leaves the queue of waiters at once (the server forgets its inbox with
// the unsubscribe; a cluster keeps it, see
// TestClusterGivenUpPullIsTakenOver).
func TestGivenUpPullLeavesTheQueue(t *testing.T) {
	name := "given-up-pull"
	s := initNATS(t, name, 1)
	held, err := s.Acquire(semtest.Context(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = held.Release(t.Context()) }()
	cons := rawConsumer(t, name)
	waiting := func(n int) func() bool {
		return func() bool {
			info, err := cons.Info(t.Context())
			return err == nil && info.NumWaiting == n
		}
	}
	for range 3 {
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { _, err := s.Acquire(ctx); done <- err }()
		waitFor(t, "the caller queued", waiting(1))
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("caller: %v", err)
		}
		waitFor(t, "the given-up pull gone", waiting(0))
	}
}

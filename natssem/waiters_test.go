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

// TestWaiterOutlivesPullExpiry: a caller that waits longer than one pull
// request lives re-issues it and still gets the permit.
func TestWaiterOutlivesPullExpiry(t *testing.T) {
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

// TestGivenUpPullIsNotInherited: a caller that gives up leaves its pull
// queued until it ends (see TestClusterCancelledWaiterStrandsNothing); the
// next caller of the same Semaphore must not take that place in the queue,
// ahead of a caller that started waiting before it. The released token
// bounces off the given-up pull and goes to the earlier caller.
func TestGivenUpPullIsNotInherited(t *testing.T) {
	name := "given-up-pull"
	s := initNATS(t, name, 1)
	other := openNATS(t, name)
	held, err := s.Acquire(semtest.Context(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	cons := rawConsumer(t, name)
	waiting := func(n int) func() bool {
		return func() bool {
			info, err := cons.Info(t.Context())
			return err == nil && info.NumWaiting == n
		}
	}
	qctx, quit := context.WithCancel(t.Context())
	quitDone := make(chan error, 1)
	go func() { _, err := s.Acquire(qctx); quitDone <- err }()
	waitFor(t, "the first caller queued", waiting(1))

	type result struct {
		who string
		p   tokensem.Permit
	}
	got := make(chan result, 2)
	go func() {
		p, err := other.Acquire(semtest.Context(t, 10*time.Second))
		if err != nil {
			t.Error(err)
		}
		got <- result{"earlier", p}
	}()
	waitFor(t, "the earlier caller queued", waiting(2))
	quit()
	if err := <-quitDone; !errors.Is(err, context.Canceled) {
		t.Fatalf("first caller: %v", err)
	}
	// The given-up pull still counts: its inbox waits for its end.
	if info, err := cons.Info(t.Context()); err != nil || info.NumWaiting != 2 {
		t.Fatalf("waiting after the give-up: %+v, %v; want the given-up pull still queued", info, err)
	}
	go func() {
		p, err := s.Acquire(semtest.Context(t, 10*time.Second))
		if err != nil {
			t.Error(err)
		}
		got <- result{"later", p}
	}()
	waitFor(t, "the later caller queued", waiting(3))
	if err := held.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	first := <-got
	if first.who != "earlier" {
		t.Fatalf("the %s caller got the permit first", first.who)
	}
	if err := first.p.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if second := <-got; second.p != nil {
		_ = second.p.Release(t.Context())
	}
}

package tokensem_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/semtest"
	"github.com/tokensem/tokensem/natssem"
)

// newSem starts an embedded NATS server for one test and creates a
// semaphore of n permits on it.
func newSem(t *testing.T, n int) *natssem.Semaphore {
	t.Helper()
	nc, err := nats.Connect(startNATS(t).URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	s, err := natssem.Init(bounded(t), nc, "do", n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// bounded returns a context that ends with the test or after 30 s, so a
// broker that stops answering fails the call that waited on it.
func bounded(t *testing.T) context.Context { return semtest.Context(t, 30*time.Second) }

// hold takes a permit and releases it when the test ends. It waits
// (Acquire, bounded) rather than TryAcquire: right after Init, a no-wait
// pull on the new consumer has been seen to answer "no messages" about once
// in 300 runs.
func hold(t *testing.T, s tokensem.Semaphore) tokensem.Permit {
	t.Helper()
	p, err := s.Acquire(bounded(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Release(context.Background()) })
	return p
}

// waitFor polls cond until it holds, failing the test after 20 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func available(t *testing.T, s tokensem.Semaphore) int {
	t.Helper()
	st, err := s.Status(bounded(t))
	if err != nil {
		t.Fatal(err)
	}
	return st.Available
}

func TestDoRunsAndReleases(t *testing.T) {
	s := newSem(t, 2)
	ran := false
	err := tokensem.Do(bounded(t), s, func(ctx context.Context) error {
		ran = true
		if got := available(t, s); got != 1 {
			t.Errorf("available while fn runs = %d, want 1", got)
		}
		return nil
	}, tokensem.WithWait(time.Second))
	if err != nil || !ran {
		t.Fatalf("Do = %v, ran = %v", err, ran)
	}
	if got := available(t, s); got != 2 {
		t.Fatalf("available after Do = %d, want 2", got)
	}
}

func TestDoReturnsFnError(t *testing.T) {
	s := newSem(t, 1)
	boom := errors.New("boom")
	if err := tokensem.Do(bounded(t), s, func(context.Context) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("Do = %v, want %v", err, boom)
	}
	if got := available(t, s); got != 1 {
		t.Fatalf("available after Do = %d, want 1", got)
	}
}

func TestDoWithoutPermitInTime(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []tokensem.DoOption
	}{
		{"no wait", []tokensem.DoOption{tokensem.WithWait(0)}},
		{"budget", []tokensem.DoOption{tokensem.WithWait(50 * time.Millisecond)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSem(t, 1)
			hold(t, s)
			fn := func(context.Context) error {
				t.Error("fn ran without a permit")
				return nil
			}
			err := tokensem.Do(bounded(t), s, fn, tc.opts...)
			if !errors.Is(err, tokensem.ErrNoPermit) {
				t.Fatalf("Do = %v, want ErrNoPermit", err)
			}

			var got error
			want := errors.New("fallback's answer")
			err = tokensem.Do(bounded(t), s, fn, append(tc.opts, tokensem.WithFallback(func(ctx context.Context, err error) error {
				got = err
				return want
			}))...)
			if err != want {
				t.Fatalf("Do with fallback = %v, want the fallback's result", err)
			}
			if !errors.Is(got, tokensem.ErrNoPermit) {
				t.Fatalf("fallback got %v, want ErrNoPermit", got)
			}
		})
	}
}

// TestDoBudgetNotCallersDeadline checks that fn runs under the caller's ctx,
// not the acquire budget: a budget shorter than fn's work does not cancel it.
func TestDoBudgetNotCallersDeadline(t *testing.T) {
	s := newSem(t, 1)
	// The budget must cover the acquire of a free permit on a loaded
	// machine (10 ms did not, beside two CPU hogs); fn outlasts it.
	const budget = 500 * time.Millisecond
	ran := false
	err := tokensem.Do(bounded(t), s, func(ctx context.Context) error {
		ran = true
		// The budget began before fn: it is certainly over after a whole
		// budget more. Then check ctx.
		time.Sleep(budget + 100*time.Millisecond)
		return ctx.Err()
	}, tokensem.WithWait(budget))
	switch {
	case !ran:
		t.Fatalf("Do = %v: fn did not run (the acquire of a free permit took the %v budget)", err, budget)
	case err != nil:
		t.Fatalf("Do = %v: fn's ctx ended with the acquire budget", err)
	}
}

// TestDoWaitsWithinBudget releases a held permit while Do waits with a
// generous budget: Do gets it and runs fn, and the fallback is not called.
func TestDoWaitsWithinBudget(t *testing.T) {
	s := newSem(t, 1)
	p := hold(t, s)
	ctx := bounded(t)
	done := make(chan error, 1)
	ran := make(chan struct{}, 1)
	go func() {
		done <- tokensem.Do(ctx, s, func(context.Context) error {
			ran <- struct{}{}
			return nil
		}, tokensem.WithWait(20*time.Second), tokensem.WithFallback(func(context.Context, error) error {
			return errors.New("fallback called although the permit came in time")
		}))
	}()
	waitForWaiter(t, s)
	if err := p.Release(bounded(t)); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Do = %v", err)
	}
	select {
	case <-ran:
	default:
		t.Fatal("fn did not run")
	}
}

// waitForWaiter polls until s has a caller waiting in Acquire.
func waitForWaiter(t *testing.T, s tokensem.Semaphore) {
	t.Helper()
	waitFor(t, "a waiter", func() bool {
		st, err := s.Status(bounded(t))
		return err == nil && st.Waiting == 1
	})
}

func TestDoFallbackCases(t *testing.T) {
	fn := func(context.Context) error { return errors.New("fn ran without a permit") }
	fallback := errors.New("fallback")

	t.Run("caller's deadline", func(t *testing.T) {
		s := newSem(t, 1)
		hold(t, s)
		ctx, cancel := context.WithTimeout(bounded(t), 50*time.Millisecond)
		defer cancel()
		var got error
		err := tokensem.Do(ctx, s, fn, tokensem.WithFallback(func(ctx context.Context, err error) error {
			got = err
			return fallback
		}))
		if err != fallback || !errors.Is(got, context.DeadlineExceeded) {
			t.Fatalf("Do = %v, fallback got %v; want the fallback on the caller's deadline", err, got)
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		s := newSem(t, 1)
		hold(t, s)
		ctx, cancel := context.WithCancel(bounded(t))
		defer cancel()
		done := make(chan error, 1)
		go func() {
			done <- tokensem.Do(ctx, s, fn, tokensem.WithWait(20*time.Second), tokensem.WithFallback(func(context.Context, error) error {
				return fallback
			}))
		}()
		waitForWaiter(t, s)
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("Do = %v, want context.Canceled without the fallback", err)
		}
	})
	t.Run("closed", func(t *testing.T) {
		s := newSem(t, 1)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		err := tokensem.Do(bounded(t), s, fn, tokensem.WithWait(0), tokensem.WithFallback(func(context.Context, error) error {
			return fallback
		}))
		if !errors.Is(err, tokensem.ErrClosed) {
			t.Fatalf("Do = %v, want ErrClosed without the fallback", err)
		}
	})
}

func TestDoInvalidOptions(t *testing.T) {
	s := newSem(t, 1)
	for _, tc := range []struct {
		name string
		opt  tokensem.DoOption
	}{
		{"negative wait", tokensem.WithWait(-time.Second)},
		{"nil fallback", tokensem.WithFallback(nil)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tokensem.Do(bounded(t), s, func(context.Context) error {
				t.Error("fn ran despite an invalid option")
				return nil
			}, tc.opt)
			if !errors.Is(err, tokensem.ErrInvalidOption) {
				t.Fatalf("Do = %v, want ErrInvalidOption", err)
			}
		})
	}
	if got := available(t, s); got != 1 {
		t.Fatalf("available = %d after rejected calls, want 1", got)
	}
}

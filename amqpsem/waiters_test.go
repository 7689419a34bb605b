package amqpsem_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/amqpsem"
	"github.com/tokensem/tokensem/internal/semtest"
)

// TestMaxWaiters: callers waiting in Acquire are capped per Conn
// (WithMaxConnWaiters, across its semaphores) and per Semaphore
// (WithMaxLocalWaiters); one more fails at once with ErrTooManyWaiters, and a
// waiter that gives up frees its place. TryAcquire is not counted.
func TestMaxWaiters(t *testing.T) {
	ctx := semtest.Context(t, time.Minute)
	n, m := name(t), name(t)+"-2"
	s := initAMQP(t, n, 1)
	initAMQP(t, m, 1)
	held, err := s.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)

	c, err := amqpsem.Dial(ctx, broker.URL, amqpsem.WithMaxConnWaiters(2))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	capped, err := amqpsem.Open(ctx, c, n, amqpsem.WithMaxLocalWaiters(1))
	if err != nil {
		t.Fatal(err)
	}
	defer capped.Close()
	other, err := amqpsem.Open(ctx, c, m)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	otherHeld, err := other.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer otherHeld.Release(ctx)

	wctx, stop := context.WithCancel(ctx)
	errs := make(chan error, 2)
	wait := func(s *amqpsem.Semaphore) {
		go func() { _, err := s.Acquire(wctx); errs <- err }()
	}
	waiting := func(s *amqpsem.Semaphore, want int) {
		t.Helper()
		for {
			cnt, err := s.Count(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if cnt.Waiting == want {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	wait(capped)
	waiting(capped, 1)
	if _, err := capped.Acquire(ctx); !errors.Is(err, tokensem.ErrTooManyWaiters) {
		t.Errorf("second waiter on a Semaphore of WithMaxLocalWaiters(1): %v, want ErrTooManyWaiters", err)
	}
	if _, err := capped.TryAcquire(ctx); !errors.Is(err, tokensem.ErrNoPermit) {
		t.Errorf("try acquire: %v, want ErrNoPermit", err)
	}
	wait(other)
	waiting(other, 1)
	if _, err := other.Acquire(ctx); !errors.Is(err, tokensem.ErrTooManyWaiters) {
		t.Errorf("third waiter on a Conn of WithMaxConnWaiters(2): %v, want ErrTooManyWaiters", err)
	}
	stop()
	for range 2 {
		if err := <-errs; !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled waiter: %v", err)
		}
	}
	tctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := capped.Acquire(tctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("waiter after the others gave up: %v, want it to wait until its deadline", err)
	}
	for _, bad := range []int{0, 65536} {
		if _, err := amqpsem.Dial(ctx, broker.URL, amqpsem.WithMaxConnWaiters(bad)); !errors.Is(err, tokensem.ErrInvalidOption) {
			t.Errorf("WithMaxConnWaiters(%d): %v", bad, err)
		}
		if _, err := amqpsem.Open(ctx, c, n, amqpsem.WithMaxLocalWaiters(bad)); !errors.Is(err, tokensem.ErrInvalidOption) {
			t.Errorf("WithMaxLocalWaiters(%d): %v", bad, err)
		}
	}
}

package main

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// startRedis starts a redis-server for one test, or skips the test when
// none is installed.
func startRedis(t *testing.T) *RedisServer {
	t.Helper()
	srv, err := StartRedis(t.Context(), "")
	if errors.Is(err, ErrNoRedis) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	return srv
}

func TestStartRedisMissing(t *testing.T) {
	_, err := StartRedis(t.Context(), "/nonexistent/redis-server")
	if !errors.Is(err, ErrNoRedis) {
		t.Fatalf("err = %v, want ErrNoRedis", err)
	}
	if want := "apt-get install -y redis-server"; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}
}

// TestRedisSemAtMostN: 24 callers on 8 clients contend for 3 permits of
// the sorted-set semaphore against a real redis-server; never more than 3
// hold at once, and every caller is eventually admitted.
func TestRedisSemAtMostN(t *testing.T) {
	srv := startRedis(t)
	sys := newRedisSystem(srv, "redis-test", time.Millisecond, 3*time.Millisecond)
	t.Cleanup(sys.Close)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	const n, clients, callers, rounds = 3, 8, 24, 15
	c0, err := sys.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c0.Close()
	if _, err := c0.Init(ctx, "atmostn", n, 0); err != nil {
		t.Fatal(err)
	}
	sems := make([]Sem, clients)
	for i := range sems {
		c, err := sys.Connect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if sems[i], err = c.Open(ctx, "atmostn"); err != nil {
			t.Fatal(err)
		}
	}
	var m Meter
	var admitted atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for i := range callers {
		s := sems[i%clients]
		wg.Go(func() {
			for range rounds {
				h, err := s.Acquire(ctx)
				if err != nil {
					errs <- err
					return
				}
				m.Enter()
				admitted.Add(1)
				time.Sleep(200 * time.Microsecond)
				m.Leave()
				if err := h.Release(ctx); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if m.Peak() > n {
		t.Fatalf("%d holders at once, N = %d", m.Peak(), n)
	}
	if m.Peak() < 2 {
		t.Errorf("at most %d holder at once: no contention was tested", m.Peak())
	}
	if got := admitted.Load(); got != callers*rounds {
		t.Errorf("%d admissions, want %d", got, callers*rounds)
	}
	st, err := sems[0].Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Held != 0 || st.Permits != n {
		t.Errorf("status after all released: %+v", st)
	}
}

// TestRedisSemExpiry: a holder that never releases is dropped once its
// lease has passed, and TryAcquire refuses without leaving a member.
func TestRedisSemExpiry(t *testing.T) {
	srv := startRedis(t)
	c := newRedisClient(srv.Addr, 2)
	defer c.Close()
	ctx := t.Context()
	if err := InitRedisSem(ctx, c, "expiry", 1); err != nil {
		t.Fatal(err)
	}
	s, err := OpenRedisSem(ctx, c, "expiry", time.Millisecond, 2*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.lease = 300 * time.Millisecond
	if _, err := s.Acquire(ctx); err != nil { // never released
		t.Fatal(err)
	}
	ok, err := s.TryAcquire(ctx, "other")
	if err != nil || ok {
		t.Fatalf("second holder admitted while the first is live: ok=%v err=%v", ok, err)
	}
	if n, _ := c.ZCard(ctx, redisKey("expiry")).Result(); n != 1 {
		t.Errorf("a refused caller left its member: %d members", n)
	}
	t0 := time.Now()
	h, err := s.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d < 200*time.Millisecond {
		t.Errorf("admitted after %v, before the first holder's lease ran out", d)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenRedisSem(ctx, c, "missing", 0, 0, nil); err == nil {
		t.Error("OpenRedisSem of an uninitialized semaphore: no error")
	}
}

// TestRedisSemCancel: a waiter whose ctx ends returns ctx.Err() and stops
// counting as waiting.
func TestRedisSemCancel(t *testing.T) {
	srv := startRedis(t)
	sys := newRedisSystem(srv, "redis-test", 5*time.Millisecond, 10*time.Millisecond)
	t.Cleanup(sys.Close)
	cl, err := sys.Connect(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	s, err := cl.Init(t.Context(), "cancel", 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(t.Context()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if _, err := s.Acquire(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want DeadlineExceeded", err)
	}
	if n, _ := sys.Waiting(t.Context(), "cancel"); n != 0 {
		t.Errorf("%d still counted waiting", n)
	}
}

package cfgcache

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestFresh(t *testing.T) {
	var c Cache[int]
	reads := 0
	read := func(context.Context) (int, error) { reads++; return 10 * reads, nil }
	ctx := t.Context()
	if v, _ := c.Fresh(ctx, time.Hour, read); v != 10 || reads != 1 {
		t.Fatalf("first Fresh = %d after %d reads, want a read", v, reads)
	}
	if v, _ := c.Fresh(ctx, time.Hour, read); v != 10 || reads != 1 {
		t.Fatalf("Fresh within the TTL = %d after %d reads, want the cached value", v, reads)
	}
	if v, _ := c.Fresh(ctx, 0, read); v != 20 || reads != 2 {
		t.Fatalf("Fresh past the TTL = %d after %d reads, want a read", v, reads)
	}
	boom := errors.New("broker gone")
	if _, err := c.Refresh(ctx, func(context.Context) (int, error) { return 0, boom }); !errors.Is(err, boom) {
		t.Fatalf("Refresh error = %v", err)
	}
	if c.Get() != 20 {
		t.Fatalf("a failed read replaced the value: %d", c.Get())
	}
	c.Set(5)
	if v, _ := c.Fresh(ctx, time.Hour, read); v != 5 {
		t.Fatalf("Fresh after Set = %d", v)
	}
}

func TestPrefetch(t *testing.T) {
	ctx := t.Context()
	var c Cache[int]
	c.Set(1)
	reads := 0
	c.Prefetch(ctx, time.Hour, func(context.Context) (int, error) { reads++; return 2, nil })()
	if reads != 0 || c.Get() != 1 {
		t.Fatalf("Prefetch of a fresh value read %d times, value %d", reads, c.Get())
	}

	// A value never read: Prefetch reads once, and Fresh waits for that
	// read instead of starting its own.
	c = Cache[int]{}
	release := make(chan struct{})
	var prefetched int
	stop := c.Prefetch(ctx, time.Hour, func(context.Context) (int, error) {
		prefetched++
		<-release
		return 3, nil
	})
	c.Prefetch(ctx, time.Hour, func(context.Context) (int, error) { t.Error("a second prefetch read"); return 0, nil })()
	got := make(chan int)
	go func() {
		v, err := c.Fresh(ctx, time.Hour, func(context.Context) (int, error) { t.Error("Fresh read beside a prefetch"); return 0, nil })
		if err != nil {
			t.Error(err)
		}
		got <- v
	}()
	select {
	case v := <-got:
		t.Fatalf("Fresh returned %d before the prefetch ended", v)
	case <-time.After(20 * time.Millisecond):
	}
	close(release)
	if v := <-got; v != 3 || prefetched != 1 {
		t.Fatalf("Fresh = %d after %d prefetch reads, want 3 after 1", v, prefetched)
	}
	stop()
}

func TestPrefetchStopAndFailure(t *testing.T) {
	ctx := t.Context()
	var c Cache[int]
	// stop cancels a read under way and waits for it.
	started := make(chan struct{})
	var ended bool
	stop := c.Prefetch(ctx, 0, func(ctx context.Context) (int, error) {
		close(started)
		<-ctx.Done()
		ended = true
		return 0, ctx.Err()
	})
	<-started
	stop()
	if !ended {
		t.Fatal("stop returned before the read ended")
	}
	// The failed read stored nothing, so Fresh reads.
	v, err := c.Fresh(ctx, time.Hour, func(context.Context) (int, error) { return 7, nil })
	if err != nil || v != 7 {
		t.Fatalf("Fresh after a cancelled prefetch = %d, %v; want 7", v, err)
	}
	// A prefetch that fails leaves Fresh to read for itself.
	boom := errors.New("broker gone")
	stop = c.Prefetch(ctx, 0, func(context.Context) (int, error) { return 0, boom })
	v, err = c.Fresh(ctx, 0, func(context.Context) (int, error) { return 8, nil })
	stop()
	if err != nil || v != 8 {
		t.Fatalf("Fresh after a failed prefetch = %d, %v; want 8", v, err)
	}
}

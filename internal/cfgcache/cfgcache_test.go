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

// A value is as old as the request that read it: a read that took longer
// than the TTL stores a value that is stale at once, so the next Fresh
// reads again (stamped when the read ended, it would be trusted for a
// whole TTL more than its read can vouch for).
func TestStampedWhenTheReadBegan(t *testing.T) {
	ctx := t.Context()
	const ttl = 50 * time.Millisecond
	var c Cache[int]
	slow := func(context.Context) (int, error) { time.Sleep(2 * ttl); return 1, nil }
	before := time.Now()
	if _, err := c.Refresh(ctx, slow); err != nil {
		t.Fatal(err)
	}
	if _, at := c.GetAt(); at.After(before.Add(ttl)) {
		t.Fatalf("value stamped %v after the read began, want the start", at.Sub(before))
	}
	reads := 0
	if v, _ := c.Fresh(ctx, ttl, func(context.Context) (int, error) { reads++; return 2, nil }); v != 2 || reads != 1 {
		t.Fatalf("Fresh after a read longer than the TTL = %d after %d reads, want a new read", v, reads)
	}

	// The same through Prefetch.
	c = Cache[int]{}
	stop := c.Prefetch(ctx, 0, slow)
	stop()
	reads = 0
	if v, _ := c.Fresh(ctx, ttl, func(context.Context) (int, error) { reads++; return 3, nil }); v != 3 || reads != 1 {
		t.Fatalf("Fresh after a slow prefetch = %d after %d reads, want a new read", v, reads)
	}
}

// A read that began before another never replaces that other's value,
// whichever ends first.
func TestOlderReadNeverReplacesNewer(t *testing.T) {
	ctx := t.Context()
	var c Cache[int]
	inOld, releaseOld := make(chan struct{}), make(chan struct{})
	oldDone := make(chan int)
	go func() {
		v, err := c.Refresh(ctx, func(context.Context) (int, error) {
			close(inOld)
			<-releaseOld
			return 1, nil // what the broker said before the change
		})
		if err != nil {
			t.Error(err)
		}
		oldDone <- v
	}()
	<-inOld
	time.Sleep(time.Millisecond) // the newer read begins strictly later
	if v, err := c.Refresh(ctx, func(context.Context) (int, error) { return 2, nil }); err != nil || v != 2 {
		t.Fatalf("newer Refresh = %d, %v", v, err)
	}
	close(releaseOld)
	if v := <-oldDone; v != 2 {
		t.Fatalf("the older Refresh returned %d, want the newer value 2", v)
	}
	if v := c.Get(); v != 2 {
		t.Fatalf("stored %d after an older read ended last, want 2", v)
	}
	if c.SetAt(0, time.Now().Add(-time.Hour)) || c.Get() != 2 {
		t.Fatalf("SetAt of an older read replaced the value")
	}
}

// TestAhead: a value younger than the ahead age starts nothing; an older
// one (still within Fresh's TTL) is read in the background on the
// caller's goroutine owner, while Fresh returns the cached value without
// waiting; a second Ahead meanwhile starts nothing; an owner that is
// closing (spawn false) starts nothing and leaves no read marked under way.
func TestAhead(t *testing.T) {
	ctx := t.Context()
	var c Cache[int]
	c.Set(1)
	spawned := 0
	spawn := func(f func()) bool { spawned++; go f(); return true }
	never := func(context.Context) (int, error) { t.Error("a read"); return 0, nil }
	c.Ahead(ctx, time.Hour, never, spawn)
	if spawned != 0 {
		t.Fatalf("Ahead of a young value spawned %d reads", spawned)
	}

	release := make(chan struct{})
	c.Ahead(ctx, 0, func(context.Context) (int, error) { <-release; return 2, nil }, spawn)
	c.Ahead(ctx, 0, never, spawn)
	if spawned != 1 {
		t.Fatalf("two Aheads spawned %d reads, want 1", spawned)
	}
	if v, err := c.Fresh(ctx, time.Hour, never); v != 1 || err != nil {
		t.Fatalf("Fresh within the TTL during a read ahead = %d, %v; want the cached 1 at once", v, err)
	}
	close(release)
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.mu.Lock()
		v, reading := c.v, c.reading
		c.mu.Unlock()
		if v == 2 && reading == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the read ahead never stored its value and ended")
		}
		time.Sleep(time.Millisecond)
	}

	c.Ahead(ctx, 0, never, func(func()) bool { return false })
	c.mu.Lock()
	reading := c.reading
	c.mu.Unlock()
	if reading != nil {
		t.Fatal("a read the owner refused is marked under way")
	}
}

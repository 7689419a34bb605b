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

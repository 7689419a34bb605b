// Package cfgcache holds a semaphore's configuration as a client last read
// it, and re-reads it once it is older than a TTL, so that every client
// admits by a resized permit count within that TTL. Both backends use it.
package cfgcache

import (
	"context"
	"sync"
	"time"
)

// Cache is a configuration and when it was read. The zero Cache holds the
// zero value, read never (so Fresh reads). Safe for concurrent use.
type Cache[C any] struct {
	mu sync.Mutex
	v  C
	at time.Time
	// reading is closed when the read Prefetch started ends; nil when none
	// is under way.
	reading chan struct{}
}

// Set stores v, read now.
func (c *Cache[C]) Set(v C) {
	c.mu.Lock()
	c.v, c.at = v, time.Now()
	c.mu.Unlock()
}

// Get returns the stored value, however old.
func (c *Cache[C]) Get() C {
	v, _ := c.GetAt()
	return v
}

// GetAt returns the stored value and when it was read.
func (c *Cache[C]) GetAt() (C, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.v, c.at
}

// Refresh reads the value with read and stores it.
func (c *Cache[C]) Refresh(ctx context.Context, read func(context.Context) (C, error)) (C, error) {
	v, err := read(ctx)
	if err != nil {
		var zero C
		return zero, err
	}
	c.Set(v)
	return v, nil
}

// Fresh returns the stored value if it is younger than ttl, else
// refreshes it. A read Prefetch started is awaited first (bounded by ctx)
// rather than doubled; if what it stored is still not fresh enough, or it
// failed, Fresh reads.
func (c *Cache[C]) Fresh(ctx context.Context, ttl time.Duration, read func(context.Context) (C, error)) (C, error) {
	c.mu.Lock()
	v, at, reading := c.v, c.at, c.reading
	c.mu.Unlock()
	if time.Since(at) < ttl {
		return v, nil
	}
	if reading != nil {
		select {
		case <-reading:
		case <-ctx.Done():
			var zero C
			return zero, ctx.Err()
		}
		c.mu.Lock()
		v, at = c.v, c.at
		c.mu.Unlock()
		if time.Since(at) < ttl {
			return v, nil
		}
	}
	return c.Refresh(ctx, read)
}

// Prefetch starts reading the value in the background when Fresh would
// read it now (it is ttl old or more) and no prefetch is under way, so
// that the read overlaps whatever the caller does before it needs the
// value (an Acquire: its pull). The value keeps the time its read ended,
// so Fresh's TTL holds exactly as without a prefetch. stop cancels the
// read if it is still running and waits for its goroutine; call it before
// returning. Without a read to start, stop does nothing.
func (c *Cache[C]) Prefetch(ctx context.Context, ttl time.Duration, read func(context.Context) (C, error)) (stop func()) {
	c.mu.Lock()
	if c.reading != nil || time.Since(c.at) < ttl {
		c.mu.Unlock()
		return func() {}
	}
	reading := make(chan struct{})
	c.reading = reading
	c.mu.Unlock()
	rctx, cancel := context.WithCancel(ctx)
	go func() {
		defer close(reading)
		v, err := read(rctx)
		c.mu.Lock()
		defer c.mu.Unlock()
		if err == nil {
			c.v, c.at = v, time.Now()
		}
		c.reading = nil
	}()
	return func() {
		cancel()
		<-reading
	}
}

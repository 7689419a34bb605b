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
}

// Set stores v, read now.
func (c *Cache[C]) Set(v C) {
	c.mu.Lock()
	c.v, c.at = v, time.Now()
	c.mu.Unlock()
}

// Get returns the stored value, however old.
func (c *Cache[C]) Get() C {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.v
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
// refreshes it.
func (c *Cache[C]) Fresh(ctx context.Context, ttl time.Duration, read func(context.Context) (C, error)) (C, error) {
	c.mu.Lock()
	v, at := c.v, c.at
	c.mu.Unlock()
	if time.Since(at) < ttl {
		return v, nil
	}
	return c.Refresh(ctx, read)
}

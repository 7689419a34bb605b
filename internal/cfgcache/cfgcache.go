// Package cfgcache holds a semaphore's configuration as a client last read
// it, and re-reads it once it is older than a TTL, so that every client
// admits by a resized permit count within that TTL. Both backends use it.
//
// A value is stamped with the time its read began, not ended: a read
// answered before a change but received after it must not look younger
// than the change. So a value used at time t was read by a request sent
// after t - TTL, and a change that was complete before then is in it. For
// the same reason a read never replaces a value whose read began later.
package cfgcache

import (
	"context"
	"sync"
	"time"
)

// Cache is a configuration and when its read began. The zero Cache holds
// the zero value, read never (so Fresh reads). Safe for concurrent use.
type Cache[C any] struct {
	mu sync.Mutex
	v  C
	at time.Time
	// reading is closed when the background read Prefetch or Ahead
	// started ends; nil when none is under way.
	reading chan struct{}
}

// Set stores v as read now. Use it for a value this client made (what an
// Init wrote); a value read from the broker goes in with SetAt.
func (c *Cache[C]) Set(v C) { c.SetAt(v, time.Now()) }

// SetAt stores v, whose read began at at, unless the cache holds a value
// whose read began later; it reports whether v was stored.
func (c *Cache[C]) SetAt(v C, at time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if at.Before(c.at) {
		return false
	}
	c.v, c.at = v, at
	return true
}

// Get returns the stored value, however old.
func (c *Cache[C]) Get() C {
	v, _ := c.GetAt()
	return v
}

// GetAt returns the stored value and when its read began.
func (c *Cache[C]) GetAt() (C, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.v, c.at
}

// Refresh reads the value with read and stores it. It returns the value
// it read, or, when a read that began later stored its value first, that
// newer one.
func (c *Cache[C]) Refresh(ctx context.Context, read func(context.Context) (C, error)) (C, error) {
	start := time.Now()
	v, err := read(ctx)
	if err != nil {
		var zero C
		return zero, err
	}
	if !c.SetAt(v, start) {
		return c.Get(), nil
	}
	return v, nil
}

// Fresh returns the stored value if its read began less than ttl ago,
// else refreshes it. A background read (Prefetch, Ahead) is awaited first
// (bounded by ctx) rather than doubled; if what it stored is still not fresh enough,
// or it failed, Fresh reads.
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
// value (an Acquire: its pull). The value is stamped with the time its
// read began, as Refresh stamps it, so Fresh's TTL holds exactly as without
// a prefetch. stop cancels the read if it is still running and waits for
// its goroutine; call it before returning. Without a read to start, stop
// does nothing.
func (c *Cache[C]) Prefetch(ctx context.Context, ttl time.Duration, read func(context.Context) (C, error)) (stop func()) {
	rctx, cancel := context.WithCancel(ctx)
	var reading chan struct{}
	started := c.start(ttl, func(r chan struct{}) bool {
		reading = r
		go c.run(rctx, r, read)
		return true
	})
	if !started {
		cancel()
		return func() {}
	}
	return func() {
		cancel()
		<-reading
	}
}

// Ahead starts reading the value in the background, as Prefetch does,
// once its read began age ago or more: with age under the TTL its callers
// give Fresh, a value in steady use is read again before Fresh would make
// a caller wait for the read. spawn runs the read on a goroutine its
// caller owns (and stops through ctx), or returns false when it cannot
// (its owner is closing), and no read starts.
func (c *Cache[C]) Ahead(ctx context.Context, age time.Duration, read func(context.Context) (C, error), spawn func(func()) bool) {
	c.start(age, func(r chan struct{}) bool {
		return spawn(func() { c.run(ctx, r, read) })
	})
}

// start marks a background read under way and hands its channel to begin,
// unless one is under way already or the value's read began less than age
// ago; it reports whether begin started the read.
func (c *Cache[C]) start(age time.Duration, begin func(reading chan struct{}) bool) bool {
	c.mu.Lock()
	if c.reading != nil || time.Since(c.at) < age {
		c.mu.Unlock()
		return false
	}
	reading := make(chan struct{})
	c.reading = reading
	c.mu.Unlock()
	if begin(reading) {
		return true
	}
	c.mu.Lock()
	c.reading = nil
	c.mu.Unlock()
	close(reading)
	return false
}

// run is a background read: it stores what it read, stamped with the time
// the read began, and closes reading.
func (c *Cache[C]) run(ctx context.Context, reading chan struct{}, read func(context.Context) (C, error)) {
	defer close(reading)
	start := time.Now()
	v, err := read(ctx)
	if err == nil {
		c.SetAt(v, start)
	}
	c.mu.Lock()
	c.reading = nil
	c.mu.Unlock()
}

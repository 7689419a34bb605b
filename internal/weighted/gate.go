package weighted

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/driver"
)

// Gate holds a backend semaphore's gate, made (or opened) on first use. The
// zero Gate holds none.
type Gate[T tokensem.Semaphore] struct {
	mu     sync.Mutex
	g      T
	have   bool
	closed bool
	making *making[T]     // the creation under way (see Make), if any
	wg     sync.WaitGroup // its goroutine
}

// making is one creation of the gate, shared by the callers that wait for
// it; done closes when g and err are set.
type making[T tokensem.Semaphore] struct {
	done chan struct{}
	g    T
	err  error
}

// makeTimeout bounds a creation of the gate, which goes on after the
// callers that waited for it have given up.
const makeTimeout = time.Minute

// Make returns the gate, making it with mk when there is none yet. The
// creation is not the caller's: it runs in the background, shared by every
// caller that waits for it, on a context of its own that ends after
// makeTimeout or when done closes (the semaphore's Close), and a caller
// whose ctx ends stops waiting (ctx.Err()) while it goes on. A creation
// cut short would leave the gate half made for every other client (a
// NATS seeding that others wait out for seedStallTimeout, a RabbitMQ
// creation lock held by the caller's connection). mk must be idempotent
// (Init is): another process may make the gate at the same time.
func (c *Gate[T]) Make(ctx context.Context, done <-chan struct{}, mk func(context.Context) (T, error)) (T, error) {
	var zero T
	c.mu.Lock()
	switch {
	case c.have:
		g := c.g
		c.mu.Unlock()
		return g, nil
	case c.closed:
		c.mu.Unlock()
		return zero, tokensem.ErrClosed
	}
	m := c.making
	if m == nil {
		m = &making[T]{done: make(chan struct{})}
		c.making = m
		c.wg.Add(1)
		go c.make(context.WithoutCancel(ctx), m, done, mk)
	}
	c.mu.Unlock()
	select {
	case <-m.done:
		return m.g, m.err
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}

// make runs mk for m and keeps the gate it makes.
func (c *Gate[T]) make(ctx context.Context, m *making[T], done <-chan struct{}, mk func(context.Context) (T, error)) {
	defer c.wg.Done()
	ctx, cancel := context.WithTimeout(ctx, makeTimeout)
	defer cancel()
	go func() { // ends with ctx, at the latest when make returns
		select {
		case <-done:
			cancel()
		case <-ctx.Done():
		}
	}()
	g, err := mk(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	defer close(m.done)
	c.making = nil
	switch {
	case err != nil && isClosed(done):
		m.err = tokensem.ErrClosed
	case err != nil:
		m.err = err
	case c.closed:
		_ = g.Close()
		m.err = tokensem.ErrClosed
	default:
		c.g, c.have = g, true
		m.g = g
	}
}

func isClosed(done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// Get returns the gate, opening it with open when there is none yet. open
// runs without the lock, on a ctx that also ends when done closes (the
// semaphore's Close), so that neither Close nor other callers wait on a
// broker for it. Two callers may open it at once: open must be idempotent
// (Open is), and the first gate kept wins.
func (c *Gate[T]) Get(ctx context.Context, done <-chan struct{}, open func(context.Context) (T, error)) (T, error) {
	var zero T
	c.mu.Lock()
	g, have, closed := c.g, c.have, c.closed
	c.mu.Unlock()
	switch {
	case have:
		return g, nil
	case closed:
		return zero, tokensem.ErrClosed
	}
	mctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { // ends with mctx, at the latest when Get returns
		select {
		case <-done:
			cancel()
		case <-mctx.Done():
		}
	}()
	g, err := open(mctx)
	if err != nil {
		if isClosed(done) {
			return zero, tokensem.ErrClosed
		}
		return zero, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.have:
		_ = g.Close()
		return c.g, nil
	case c.closed:
		_ = g.Close()
		return zero, tokensem.ErrClosed
	}
	c.g, c.have = g, true
	return g, nil
}

// Forget closes and drops the gate if it is stale (see Host.gate).
func (c *Gate[T]) Forget(stale tokensem.Semaphore) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.have && tokensem.Semaphore(c.g) == stale {
		_ = c.g.Close()
		var zero T
		c.g, c.have = zero, false
	}
}

// Close closes the gate, if one is held, makes later calls return
// tokensem.ErrClosed, and waits for a creation under way (see Make) to end:
// close the done channel given to Make first, which cuts it short.
func (c *Gate[T]) Close() {
	c.mu.Lock()
	c.closed = true
	if c.have {
		_ = c.g.Close()
		var zero T
		c.g, c.have = zero, false
	}
	c.mu.Unlock()
	c.wg.Wait()
}

// DeleteWithGate deletes semaphore name with del (force: ForceDelete), then
// its gate, force-deleted: a gatherer holding the gate has nothing left to
// gather. The gate is looked for even when the semaphore is gone (a delete
// cut short may have left it). It returns the semaphore's delete error.
func DeleteWithGate(ctx context.Context, name string, force bool, del func(ctx context.Context, name string, force bool) error) error {
	if err := tokensem.ValidateName(name); err != nil {
		return err
	}
	err := del(ctx, name, force)
	if err != nil && !errors.Is(err, tokensem.ErrNotInitialized) {
		return err
	}
	if gerr := del(ctx, driver.GateName(name), true); gerr != nil && !errors.Is(gerr, tokensem.ErrNotInitialized) {
		return fmt.Errorf("%s deleted, but not its gate: %w", name, gerr)
	}
	return err
}

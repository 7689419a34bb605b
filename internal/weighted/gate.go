package weighted

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/tokensem/tokensem"
)

// Gate holds a backend semaphore's gate, made (or opened) on first use. The
// zero Gate holds none.
type Gate[T tokensem.Semaphore] struct {
	mu     sync.Mutex
	g      T
	have   bool
	closed bool
}

// Get returns the gate, making it with make when there is none yet. make
// runs without the lock, on a ctx that also ends when done closes (the
// semaphore's Close), so that neither Close nor other callers wait on a
// broker for it. Two callers may make it at once: make must be idempotent
// (Init and Open are), and the first gate kept wins.
func (c *Gate[T]) Get(ctx context.Context, done <-chan struct{}, make func(context.Context) (T, error)) (T, error) {
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
	g, err := make(mctx)
	if err != nil {
		select {
		case <-done:
			return zero, tokensem.ErrClosed
		default:
			return zero, err
		}
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

// Close closes the gate, if one is held, and makes later Gets return
// tokensem.ErrClosed.
func (c *Gate[T]) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	if c.have {
		_ = c.g.Close()
		var zero T
		c.g, c.have = zero, false
	}
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
	if gerr := del(ctx, GateName(name), true); gerr != nil && !errors.Is(gerr, tokensem.ErrNotInitialized) {
		return fmt.Errorf("%s deleted, but not its gate: %w", name, gerr)
	}
	return err
}

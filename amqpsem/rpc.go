package amqpsem

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem"
)

// channel is an AMQP channel whose synchronous calls run under rpc.
type channel struct {
	*amqp.Channel
	// abandoned is set when an rpc on the channel was aborted while its
	// calls were still under way: that rpc closes the channel when they
	// return, and nothing else may use it.
	abandoned atomic.Bool

	closes   chan *amqp.Error // the broker's close of the channel (see closeReason)
	closeMu  sync.Mutex
	closeErr *amqp.Error
}

// newChannel wraps ch, noting why the broker closes it.
func newChannel(ch *amqp.Channel) *channel {
	return &channel{Channel: ch, closes: ch.NotifyClose(make(chan *amqp.Error, 1))}
}

// Close closes the channel, which requeues what it was delivered and not
// acknowledged. On a channel an aborted rpc abandoned it does nothing: the
// rpc closes it once its calls return.
func (ch *channel) Close() error {
	if ch.abandoned.Load() {
		return nil
	}
	return ch.Channel.Close()
}

// rpc runs fn, whose amqp091 calls on ch take no context, and returns its
// error. If ctx ends first, rpc returns errAborted at once and abandons ch
// to fn: fn runs on in the background until its calls return (the broker
// answers, or the connection closes), then undo (if not nil) runs and the
// channel is closed, which requeues anything it was delivered. The caller
// must not read what fn writes after errAborted; undo may.
//
// amqp091 cannot cancel a call, and closing the channel under a call in
// flight is not safe: the broker discards methods that reach it after
// channel.close, the one close-ok can be taken by fn's next call, which
// leaves the Close waiting for ever (holding a lock every later Close of
// the channel waits on), and a method that reaches the broker after the
// close-ok is a connection error (504) that drops every permit held on
// the connection. So the channel is closed only once fn has returned.
func (c *Conn) rpc(ctx context.Context, ch *channel, fn func() error, undo func()) error {
	if ch.abandoned.Load() {
		return fmt.Errorf("%w: the channel was abandoned by an earlier call", errAborted)
	}
	if ctx.Done() == nil {
		return ch.refused(fn())
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: %w", errAborted, err)
	}
	_, err, done := detach(ctx, c, func() (struct{}, error) { return struct{}{}, fn() }, func(struct{}, error) {
		if undo != nil {
			undo()
		}
		_ = ch.Channel.Close()
	})
	if !done {
		ch.abandoned.Store(true)
		return fmt.Errorf("%w: %w", errAborted, ctx.Err())
	}
	return ch.refused(err)
}

// detach runs call, which ctx cannot interrupt (an amqp091 call), in a
// goroutine the Conn waits for at Close, and returns its result, or done
// false at once if ctx ends first: call then runs on, and after it returns
// abandoned gets its result (to undo or close what it made). A result that
// comes as ctx ends is returned (done true): the caller keeps what it did.
func detach[T any](ctx context.Context, c *Conn, call func() (T, error), abandoned func(T, error)) (v T, err error, done bool) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return v, tokensem.ErrClosed, true
	}
	c.calls.Add(1)
	c.mu.Unlock()
	const (
		running = iota
		returned
		gaveUp
	)
	var state atomic.Int32
	type result struct {
		v   T
		err error
	}
	results := make(chan result, 1)
	go func() {
		defer c.calls.Done()
		v, err := call()
		if state.CompareAndSwap(running, returned) {
			results <- result{v, err}
			return
		}
		abandoned(v, err)
	}()
	select {
	case r := <-results:
		return r.v, r.err, true
	case <-ctx.Done():
		if !state.CompareAndSwap(running, gaveUp) {
			r := <-results // call returned as ctx ended
			return r.v, r.err, true
		}
		return v, nil, false
	}
}

// closeLater closes ch, which requeues what it was delivered and not
// acknowledged, without waiting for the broker's answer: a caller whose
// ctx has ended must not wait for it. Close waits for it.
func (c *Conn) closeLater(ch *channel) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return // the connection's close closes it
	}
	c.calls.Add(1)
	c.mu.Unlock()
	go func() {
		defer c.calls.Done()
		_ = ch.Close()
	}()
}

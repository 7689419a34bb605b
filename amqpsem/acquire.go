package amqpsem

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/driver"
	"github.com/tokensem/tokensem/internal/backoff"
	"github.com/tokensem/tokensem/internal/semopts"
)

// Acquire blocks until it holds a permit or ctx ends. Each waiter consumes
// the token queue on its own channel with prefetch 1, so the broker pushes
// the next free token to the longest-subscribed waiter of the highest
// class waiting (see tokensem.WithPriority: the class is the consumer's
// priority); on its first
// delivery the waiter cancels its consumer and claims the token's slot. If
// the connection drops while waiting, the call subscribes again on the new
// connection (it holds nothing yet, so nothing is lost) and keeps waiting;
// a call that gives up closes its channel, which requeues any token on its
// way to it. A broker that fails a request for a while (a node lost, a
// queue electing a leader) is waited out until ctx ends.
//
// Errors: ctx.Err(), tokensem.ErrClosed, tokensem.ErrInvalidOption (a
// class out of range), tokensem.ErrNotInitialized (the token queue is
// gone), or a broker error that waiting cannot cure.
func (s *Semaphore) Acquire(ctx context.Context) (tokensem.Permit, error) {
	return semopts.Acquire(ctx, s.opts.Observer, s.name, s.Permits, false, s.take)
}

// TryAcquire takes a free permit with one basic.get, or returns
// tokensem.ErrNoPermit at once. RabbitMQ answers a basic.get on a quorum
// queue that is electing a leader (for a moment after a node's loss) by
// closing the whole connection, and with it the permits held on it;
// Acquire does not have that cost.
//
// Errors: tokensem.ErrNoPermit, tokensem.ErrClosed, ctx.Err(), or a wrapped
// broker error.
func (s *Semaphore) TryAcquire(ctx context.Context) (tokensem.Permit, error) {
	return semopts.Acquire(ctx, s.opts.Observer, s.name, s.Permits, true, s.take)
}

const maxTryDeliveries = 16

// errRetry asks take to start over on a new channel; backoff says
// whether to pause first (a duplicate of a held slot is circulating).
type errRetry struct{ backoff bool }

func (e errRetry) Error() string { return "amqpsem: retry" }

// take is Acquire (noWait false) or TryAcquire (see semopts.Acquire, which
// reports it to the observer and returns ctx.Err() itself once ctx has
// ended, whatever step it cut short); every step is bounded by ctx
// (channel opens and closes included), so the call returns promptly after
// ctx ends.
func (s *Semaphore) take(ctx context.Context, noWait bool) (*Permit, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	prio, err := driver.PriorityOf(ctx)
	if err != nil {
		return nil, err
	}
	if !noWait {
		leave, err := s.enterWait()
		if err != nil {
			return nil, err
		}
		defer leave()
	}
	pause := 20 * time.Millisecond
	oc := s.newOrphanCheck()
	for tries := 0; ; tries++ {
		if s.isClosed() {
			return nil, tokensem.ErrClosed
		}
		if noWait && tries >= maxTryDeliveries {
			return nil, tokensem.ErrNoPermit
		}
		pc, err := s.channel(ctx)
		var retry errRetry
		switch {
		case errors.As(err, &retry) || err != nil && !noWait && transient(err):
			// The connection went away as the channel was being set up
			// (a 541 closes it): wait on, on a new one.
			if err := backoff.Sleep(ctx, pause+rand.N(pause)); err != nil {
				return nil, err
			}
			pause = min(2*pause, time.Second)
			continue
		case err != nil:
			return nil, err
		}
		// TryAcquire takes a ready token with basic.get. Acquire consumes
		// instead, even when a token is ready: a basic.get on a quorum
		// queue electing a leader is answered with 541, which closes the
		// whole connection and every permit held on it (measured on
		// 3.10.8), while a consumer just waits for the new leader. If ctx
		// ends mid-call, the call is abandoned: a permit it still makes is
		// lost, and its channel closed, which requeues the token.
		var p *Permit
		err = s.c.rpc(ctx, pc.ch, func() error {
			var err error
			if noWait {
				p, err = s.get(ctx, pc)
			} else {
				p, err = s.wait(ctx, pc, oc, prio)
			}
			return err
		}, func() {
			if p != nil {
				p.discard(fmt.Errorf("%w: %w", errAborted, ctx.Err()))
			}
		})
		if pc.ch.abandoned.Load() {
			// This rpc was aborted. (An errAborted from a call inside the
			// claim, a configuration read that timed out, is a broker
			// failure like another, retried below.)
			return nil, ctx.Err()
		}
		if p != nil {
			return p, nil
		}
		switch {
		case errors.As(err, &retry):
		case ctx.Err() != nil:
			s.c.closeLater(pc.ch) // requeues anything delivered and not claimed
			return nil, ctx.Err()
		case !noWait && transient(err):
			// The broker failed a request (a queue electing a leader, a
			// connection it closed): wait on, on a new channel.
			s.log.Warn("acquire: the broker failed; waiting on", "err", err)
			retry.backoff = true
		case errors.Is(err, tokensem.ErrNoPermit):
			s.putChannel(pc)
			return nil, err
		default:
			s.c.closeLater(pc.ch)
			return nil, err
		}
		s.c.closeLater(pc.ch)
		// TryAcquire never waits: a returned duplicate went to the back of
		// the queue, so the next get reaches the other ready tokens.
		if retry.backoff && !noWait {
			if err := backoff.Sleep(ctx, pause+rand.N(pause)); err != nil {
				return nil, err
			}
			pause = min(2*pause, time.Second)
		}
	}
}

// enterWait counts a caller of Acquire among the waiters of the Conn and
// of the Semaphore, or returns tokensem.ErrTooManyWaiters when either is
// full (see WithMaxConnWaiters, WithMaxLocalWaiters); leave uncounts it.
func (s *Semaphore) enterWait() (leave func(), err error) {
	if n := s.c.waiters.Add(1); n > int64(s.c.maxWaiters) {
		s.c.waiters.Add(-1)
		return nil, fmt.Errorf("%w: %d callers already wait in Acquire on this connection (WithMaxConnWaiters)", tokensem.ErrTooManyWaiters, n-1)
	}
	if n := s.waiters.Add(1); s.opts.maxWaiters > 0 && n > int64(s.opts.maxWaiters) {
		s.waiters.Add(-1)
		s.c.waiters.Add(-1)
		return nil, fmt.Errorf("%w: %d callers already wait in Acquire on %s (WithMaxLocalWaiters)", tokensem.ErrTooManyWaiters, n-1, s.name)
	}
	return func() { s.waiters.Add(-1); s.c.waiters.Add(-1) }, nil
}

// wait consumes the token queue, as a waiter of class prio, until one
// delivery arrives, checking for orphaned tokens when oc says so.
func (s *Semaphore) wait(ctx context.Context, pc *pooledChannel, oc *orphanCheck, prio tokensem.Priority) (*Permit, error) {
	ch := pc.ch
	tag := "tokensem-" + driver.NewToken(s.name, 0, 1).ID
	deliveries, err := ch.Consume(tokenQueue(s.name), tag, false, false, false, false, waiterArgs(prio))
	switch {
	case isCode(err, amqp.NotFound):
		return nil, fmt.Errorf("%w: token queue %s is gone", tokensem.ErrNotInitialized, tokenQueue(s.name))
	case denied(err):
		return nil, fmt.Errorf("amqpsem: wait for a token of %s: %w", s.name, err)
	case err != nil:
		return nil, errRetry{backoff: true}
	}
	// The orphan check runs apart from the wait (startOrphanCheck), so
	// that a token delivered meanwhile is claimed at once.
	var due <-chan time.Time
	var timer *time.Timer
	if oc.every > 0 {
		timer = time.NewTimer(time.Until(oc.next))
		defer timer.Stop()
		due = timer.C
	}
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.life.Done():
			return nil, tokensem.ErrClosed
		case <-pc.sess.lost:
			return nil, errRetry{}
		case <-pc.closed:
			return nil, errRetry{backoff: true}
		case <-due:
			s.startOrphanCheck()
			oc.done(s.opts.orphanRepair)
			timer.Reset(time.Until(oc.next))
		case d, ok := <-deliveries:
			if !ok {
				return nil, errRetry{backoff: true}
			}
			if err := ctx.Err(); err != nil {
				return nil, err // the caller closes the channel: d goes back unclaimed
			}
			p, err := s.claim(ctx, pc, d, false)
			if err != nil {
				return nil, err // the caller closes the channel, and the consumer with it
			}
			// Stop consuming once the slot is claimed: prefetch 1 keeps a
			// second token away meanwhile, and without a consumer the
			// token's requeue at release goes to others. The cancel (a
			// quorum queue commit) is not waited for: the broker runs a
			// channel's commands in order, so it ends before anything the
			// holder sends later, the release's requeue included.
			if err := ch.Cancel(tag, true); err != nil {
				p.lose(fmt.Errorf("amqpsem: channel closed, token requeued: %w", err))
				return nil, errRetry{}
			}
			return p, nil
		}
	}
}

// A waiter's consumer priority (x-priority; RabbitMQ serves the highest
// first, and in subscription order within one) is its class plus
// waiterPriorityBase: every class ranks above the census's consumer, at
// censusPriority, which takes only what no waiter wants.
const (
	waiterPriorityBase = 10
	censusPriority     = 0
)

// waiterArgs are the consume arguments of a waiter of class p.
func waiterArgs(p tokensem.Priority) amqp.Table {
	return amqp.Table{"x-priority": int32(waiterPriorityBase + int(p))}
}

// get takes one ready token with basic.get, or returns ErrNoPermit.
func (s *Semaphore) get(ctx context.Context, pc *pooledChannel) (*Permit, error) {
	d, ok, err := pc.ch.Get(tokenQueue(s.name), false)
	switch {
	case isCode(err, amqp.NotFound):
		return nil, fmt.Errorf("%w: token queue %s is gone", tokensem.ErrNotInitialized, tokenQueue(s.name))
	case denied(err):
		return nil, fmt.Errorf("amqpsem: take a token of %s: %w", s.name, err)
	case err != nil:
		return nil, errRetry{backoff: true}
	case !ok:
		return nil, tokensem.ErrNoPermit
	}
	return s.claim(ctx, pc, d, true)
}

package natssem

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/driver"
	"github.com/tokensem/tokensem/internal/backoff"
	"github.com/tokensem/tokensem/internal/semopts"
)

// Acquire blocks until it holds a permit or ctx ends. Callers are served by
// class (see tokensem.WithPriority; the pull's priority), and within a
// class in the order they started waiting (one pull request each, queued
// FIFO by the server; a caller waiting longer than the pull expiry
// re-queues at the back of its class; on a cluster, a caller that gives up
// leaves its place to the next caller of its class of the same Semaphore,
// see waiter). On failure nothing changes: a
// token delivered to a caller that gave up is handed on to the next waiter.
//
// A broker that does not answer for a while (a stream or consumer electing
// a new leader, a server restarting, a lost connection being re-made) does
// not end the wait: Acquire waits on through it until ctx ends.
//
// Errors: ctx.Err(), tokensem.ErrClosed, tokensem.ErrTooManyWaiters,
// tokensem.ErrInvalidOption and tokensem.ErrPriorityUnsupported (a class
// out of range, or one the semaphore's consumer cannot serve),
// tokensem.ErrNotInitialized (the semaphore was deleted),
// tokensem.ErrPermissionDenied (the broker refused one of the semaphore's
// subjects, named in the error), or a broker error that waiting cannot
// cure (wrapping tokensem.ErrUnavailable).
func (s *Semaphore) Acquire(ctx context.Context) (tokensem.Permit, error) {
	return semopts.Acquire(ctx, s.opts.Observer, s.name, s.Permits, false, s.take)
}

// TryAcquire takes a free permit or returns tokensem.ErrNoPermit at once.
//
// Errors: tokensem.ErrNoPermit, tokensem.ErrClosed, ctx.Err(),
// tokensem.ErrPermissionDenied, or a broker error (wrapping
// tokensem.ErrUnavailable).
func (s *Semaphore) TryAcquire(ctx context.Context) (tokensem.Permit, error) {
	return semopts.Acquire(ctx, s.opts.Observer, s.name, s.Permits, true, s.take)
}

// maxTryDeliveries bounds how many unusable deliveries (junk, duplicates,
// tokens held by a live holder), and answers that every ready token is
// promised to a pull queued ahead, TryAcquire looks past before giving up.
const maxTryDeliveries = 16

// take is Acquire (noWait false) or TryAcquire (see semopts.Acquire, which
// reports it to the observer).
func (s *Semaphore) take(ctx context.Context, noWait bool) (*Permit, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if s.isClosed() {
		return nil, tokensem.ErrClosed
	}
	prio, err := driver.PriorityOf(ctx)
	if err != nil {
		return nil, err
	}
	if prio != 0 && !noWait && s.config().PriorityGroup == "" {
		// The cached configuration may be of an earlier life: read it again.
		cfg, err := s.refreshConfig(ctx)
		if err != nil {
			return nil, err
		}
		if cfg.PriorityGroup == "" {
			return nil, fmt.Errorf("%w: the token consumer of %s serves waiters in arrival order only (an Init of it through nats-server 2.12 or later makes it order them by class)",
				tokensem.ErrPriorityUnsupported, s.name)
		}
	}
	if !noWait {
		if n := s.waiting.Add(1); n > int64(s.opts.maxLocal) {
			s.waiting.Add(-1)
			return nil, fmt.Errorf("%w: %d callers of %s wait in this process already (WithMaxLocalWaiters)",
				tokensem.ErrTooManyWaiters, s.opts.maxLocal, s.name)
		}
		defer s.waiting.Add(-1)
	}
	// A refusal of one of the semaphore's subjects (a pull, an ack, a
	// record write, an inbox the user may not use) ends the wait at once:
	// the broker drops what it refuses without an answer.
	ctx, stop := s.rights.guard(ctx, s, 0)
	defer stop()
	w, err := s.getWaiter(!noWait, natsPriority(prio))
	if err != nil {
		return nil, err
	}
	defer w.finish()
	// A token is admitted by a configuration read within configTTL; when
	// the cached one is older (a semaphore idle for a while, as most keys
	// of a group are), read it beside the pull, not after the delivery.
	defer s.prefetchConfig(ctx)()
	if noWait {
		// After taking the waiter: a token that reached it while idle
		// was handed back, and that hand-back is waited for too.
		s.returned.wait(ctx, s.requestTimeout())
	}
	a := &acquisition{
		s: s, w: w, noWait: noWait,
		timer: time.NewTimer(time.Hour), // set by ask
		pause: backoff.Backoff{Min: 20 * time.Millisecond, Max: time.Second},
		// A waiter taken over from a caller that gave up still has its
		// pull queued: Acquire waits on it (its place in the queue).
		adopted: !noWait && w.pending() > 0,
	}
	defer a.timer.Stop()
	for {
		if err := a.ask(ctx); err != nil {
			return nil, err
		}
		if p, err := a.await(ctx); p != nil || err != nil {
			return p, err
		}
	}
}

// An acquisition is one Acquire or TryAcquire call's turn through its
// waiter's pulls: ask (pull, or adopt the pull a caller that gave up left
// queued), await the pull's outcome, and ask again until a delivery
// becomes a permit (deliver) or the call fails.
//
// A queued pull hears a heartbeat every heartbeat interval. The first one
// is awaited briefly: the server drops a pull silently when the waiter
// queue is full. A later silence of two heartbeats means the pull was
// lost; a reconnection says so at once.
type acquisition struct {
	s       *Semaphore
	w       *waiter
	noWait  bool
	timer   *time.Timer // the next heartbeat is due when it fires
	pause   backoff.Backoff
	adopted bool
	// unanswered is since when pulls find no consumer (503).
	unanswered time.Time
	// tries counts a TryAcquire's unusable deliveries and 408s.
	tries int
	// refreshed says a 400 made the call read the configuration again.
	refreshed bool
}

// ask sends a pull, or adopts the one already queued, and sets the timer
// for its first heartbeat. A broker that fails the pull for a while is
// waited out (Acquire only).
func (a *acquisition) ask(ctx context.Context) error {
	hb := a.s.opts.heartbeat
	if a.adopted {
		a.adopted = false
		// Its first heartbeat, or the next, is due by the same rule as
		// for a pull of this call's own.
		a.timer.Reset(max(a.w.silence(hb), time.Millisecond))
		return nil
	}
	for {
		err := a.w.pull(a.noWait)
		if err == nil {
			a.timer.Reset(hb + hb/2)
			return nil
		}
		if a.noWait || !transient(err) {
			return err
		}
		if err := a.pause.Wait(ctx, a.s.done); err != nil {
			return err
		}
	}
}

// await waits for the outcome of the pull asked for: a permit, an error,
// or (nil, nil) when the call should ask again.
func (a *acquisition) await(ctx context.Context) (*Permit, error) {
	s, w := a.s, a.w
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.done:
			return nil, tokensem.ErrClosed
		case <-a.timer.C:
			// Silent: the pull is presumed lost, whether the server
			// dropped it for a full queue of waiters or otherwise (a
			// waiter still counting it would linger for it).
			w.lost()
			if err := s.checkWaiterQueue(ctx); err != nil {
				return nil, err
			}
			s.log.Debug(reissued, "reason", "silent")
			return nil, nil
		case <-w.reconnected:
			s.log.Debug(reissued, "reason", "reconnected")
			w.lost()
			return nil, nil
		case m := <-w.ch:
			a.timer.Reset(2 * s.opts.heartbeat)
			w.ended(m) // a token or a final status ends a pull
			if p, waitOn, err := a.answer(ctx, m); !waitOn {
				return p, err
			}
		}
	}
}

// tryAgain counts a no-wait pull that found every ready token promised to
// pulls queued ahead: nil to ask again, tokensem.ErrNoPermit after
// maxTryDeliveries.
func (a *acquisition) tryAgain() error {
	if a.tries++; a.tries >= maxTryDeliveries {
		return tokensem.ErrNoPermit
	}
	return nil
}

// answer handles one message to the waiter's inbox: a delivery (deliver),
// or a status of the pull. waitOn says the pull is still queued (a
// heartbeat, a message not for it); otherwise p and err are await's.
func (a *acquisition) answer(ctx context.Context, m *nats.Msg) (p *Permit, waitOn bool, err error) {
	s := a.s
	code, desc := status(m)
	switch code {
	case "":
		if !isDelivery(m) {
			return nil, true, nil // not for us
		}
		p, err := a.delivered(ctx, m)
		return p, false, err
	case "100": // idle heartbeat
		return nil, true, nil
	case "404":
		return nil, false, tokensem.ErrNoPermit
	case "408":
		if a.noWait {
			// "Requests Pending": the ready tokens are on their way to
			// pulls queued ahead. Ask again a few times (one may come
			// back, handed back by a caller that gave up), not for ever.
			return nil, false, a.tryAgain()
		}
		s.log.Debug(reissued, "reason", "expired")
		return nil, false, nil // our pull expired: re-issue it
	case "409":
		if isMaxWaiting(desc) {
			if a.noWait {
				// The waiter queue is full: a ready token goes to the
				// pulls queued there before this one, as with 408.
				// TryAcquire does not wait, so the limit on waiters is
				// not its error.
				return nil, false, a.tryAgain()
			}
			return nil, false, fmt.Errorf("%w: %s", tokensem.ErrTooManyWaiters, desc)
		}
		if err := s.checkConsumer(ctx); err != nil && !transient(err) {
			return nil, false, err
		}
		s.log.Debug(reissued, "reason", "ended by the server", "status", desc)
		return nil, false, backoff.Sleep(ctx, 10*time.Millisecond)
	case "503":
		return nil, false, a.unanswer(ctx)
	case "400":
		// The consumer refused the pull's form, which a token consumer
		// takes with either policy (pullBodies): one made anew since,
		// by another life or by someone else. Read the configuration
		// again (a handle adopts a new life) and ask once more; a second
		// refusal is an error.
		if !a.refreshed {
			a.refreshed = true
			if _, err := s.refreshConfig(ctx); err != nil {
				return nil, false, err
			}
			return nil, false, nil
		}
		return nil, false, wrapBrokerErr(fmt.Errorf("pull answered %s %s", code, desc))
	default:
		return nil, false, wrapBrokerErr(fmt.Errorf("pull answered %s %s", code, desc))
	}
}

// delivered takes a token delivered to the pull along its path (deliver).
// A claim is short and runs to its end even if ctx ends meanwhile: its
// outcome must be known.
func (a *acquisition) delivered(ctx context.Context, m *nats.Msg) (*Permit, error) {
	reserveStack() // before the claim: see there
	s := a.s
	a.unanswered = time.Time{}
	gaveUp := ctx.Done()
	if a.noWait {
		gaveUp = nil // TryAcquire does not wait for a release
	}
	p, err := s.deliver(context.WithoutCancel(ctx), gaveUp, m)
	switch {
	case p != nil:
		return p, nil
	case err != nil && (a.noWait || !transient(err)):
		return nil, err
	case err != nil:
		s.log.Warn("claim failed; waiting on", "err", err)
		if err := a.pause.Wait(ctx, s.done); err != nil {
			return nil, err
		}
	default:
		a.pause.Reset()
	}
	a.tries++
	if a.noWait && a.tries >= maxTryDeliveries {
		return nil, tokensem.ErrNoPermit
	}
	return nil, nil // stepped away: ask again
}

// unanswer handles a pull that no consumer answers (503): its stream or
// consumer is electing a leader, JetStream is restarting, or the semaphore
// was deleted. Past a request timeout of such answers it checks the
// consumer, and fails unless waiting may cure it.
func (a *acquisition) unanswer(ctx context.Context) error {
	s := a.s
	if a.unanswered.IsZero() {
		a.unanswered = time.Now()
	}
	if time.Since(a.unanswered) > s.requestTimeout() {
		err := s.checkConsumer(ctx)
		if err == nil {
			err = wrapBrokerErr(fmt.Errorf("%s: no consumer answers: %w", s.name, nats.ErrNoResponders))
		}
		if a.noWait || !transient(err) {
			return err
		}
		s.log.Warn("no consumer answers pulls; waiting on", "for", time.Since(a.unanswered).Round(time.Millisecond), "err", err)
	}
	s.log.Debug(reissued, "reason", "no responders")
	return a.pause.Wait(ctx, s.done)
}

// reissued is the message of the Debug record logged when a waiting pull
// is asked again, at the back of the server's queue of waiters: FIFO order
// is not promised across it. The conformance suite counts these records by
// this message (semtest.ReissueMessage).
const reissued = "waiting pull re-issued"

// transient reports whether err is a broker failure that waiting may cure:
// one wrapping tokensem.ErrUnavailable, unless it says the semaphore, the
// connection or JetStream itself is gone for good, or the broker refused
// it for the user's permissions.
func transient(err error) bool {
	return errors.Is(err, tokensem.ErrUnavailable) &&
		!errors.Is(err, tokensem.ErrNotInitialized) &&
		!errors.Is(err, nats.ErrConnectionClosed) &&
		!errors.Is(err, nats.ErrBadSubscription) &&
		!errors.Is(err, nats.ErrAuthorization) &&
		!errors.Is(err, nats.ErrPermissionViolation) &&
		!errors.Is(err, tokensem.ErrPermissionDenied) &&
		!errors.Is(err, jetstream.ErrJetStreamNotEnabled) &&
		!errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount)
}

// checkWaiterQueue returns tokensem.ErrTooManyWaiters if the consumer's
// queue of waiting pulls is full (the server then drops new pulls without a
// word when they carry heartbeats).
func (s *Semaphore) checkWaiterQueue(ctx context.Context) error {
	info, err := s.consumerInfo(ctx)
	if err != nil {
		return nil // cannot tell: re-issuing the pull is the safe course
	}
	if limit := info.Config.MaxWaiting; limit > 0 && info.NumWaiting >= limit {
		return fmt.Errorf("%w: %d callers already wait on %s", tokensem.ErrTooManyWaiters, info.NumWaiting, s.name)
	}
	return nil
}

// checkConsumer returns nil if the holders consumer answers,
// tokensem.ErrNotInitialized if it or its stream is gone, or the broker's
// error.
func (s *Semaphore) checkConsumer(ctx context.Context) error {
	_, err := s.consumerInfo(ctx)
	return err
}

// serverNow returns the server's current time (from consumer info), the
// clock that stamps KV entries: a record's age is measured on the server's
// clock alone, so client clocks play no part in a takeover.
func (s *Semaphore) serverNow(ctx context.Context) (time.Time, error) {
	info, err := s.consumerInfo(ctx)
	if err != nil {
		return time.Time{}, err
	}
	return info.TimeStamp, nil
}

// consumerInfo reads the holders consumer's info: one round trip (the
// lookup returns it). A missing stream or consumer is
// tokensem.ErrNotInitialized; other failures are broker errors.
func (s *Semaphore) consumerInfo(ctx context.Context) (*jetstream.ConsumerInfo, error) {
	rctx, cancel := s.rtt(ctx)
	defer cancel()
	c, err := s.js.Consumer(rctx, s.lay.stream, s.lay.consumer)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound), errors.Is(err, jetstream.ErrConsumerNotFound):
		return nil, fmt.Errorf("%w: %s: %w", tokensem.ErrNotInitialized, s.name, err)
	case err != nil:
		return nil, wrapBrokerErr(err)
	}
	return c.CachedInfo(), nil
}

// claimStack is room enough on the stack for what answer does with a
// delivery: a claim's broker requests and its record's JSON decoding,
// below the acquisition's own calls, take a little more than 7 KiB (Go
// 1.26).
const claimStack = 8 << 10

// reserveStack makes sure the calling goroutine's stack has room for a
// claim. A goroutine starts with a small stack, which Go grows by copying
// it, every frame adjusted, whenever a call needs more. A caller that
// starts a goroutine per Acquire (a handler per request, the bench's
// handoff) would have it grown at a claim's deepest call, between the
// token's arrival and the permit, with every frame of the claim copied:
// about a quarter of what natssem added to its protocol's handoff to a
// running waiter (BenchmarkHandoffVsBare, 1.35 to 1.27 times the bare
// protocol). Grown here, the copy holds only the acquisition's few frames;
// on a stack that is large enough already, this costs a bounds check and
// the zeroing of room. It is called as a message reaches the waiting
// call with a token, not before the pull (a caller that waits keeps the
// small stack) nor for a heartbeat or a status.
//
//go:noinline
func reserveStack() {
	var room [claimStack]byte
	keepStack(room[:])
}

// keepStack keeps reserveStack's room from being optimised away.
//
//go:noinline
func keepStack([]byte) {}

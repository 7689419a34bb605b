package natssem

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/backoff"
	"github.com/tokensem/tokensem/internal/semopts"
)

// Acquire blocks until it holds a permit or ctx ends. Callers are served in
// the order they started waiting (one pull request each, queued FIFO by the
// server; a caller waiting longer than the pull expiry re-queues at the
// back; on a cluster, a caller that gives up leaves its place to the next
// caller of the same Semaphore, see waiter). On failure nothing changes: a
// token delivered to a caller that gave up is handed on to the next waiter.
//
// A broker that does not answer for a while (a stream or consumer electing
// a new leader, a server restarting, a lost connection being re-made) does
// not end the wait: Acquire waits on through it until ctx ends.
//
// Errors: ctx.Err(), tokensem.ErrClosed, tokensem.ErrTooManyWaiters,
// tokensem.ErrNotInitialized (the semaphore was deleted),
// tokensem.ErrPermissionDenied (the broker refused one of the semaphore's
// subjects, named in the error), or a broker error that waiting cannot
// cure (wrapping tokensem.ErrUnavailable).
func (s *Semaphore) Acquire(ctx context.Context) (tokensem.Permit, error) {
	p, err := s.acquire(ctx, false)
	if err != nil {
		return nil, err
	}
	return p, nil
}

// TryAcquire takes a free permit or returns tokensem.ErrNoPermit at once.
//
// Errors: tokensem.ErrNoPermit, tokensem.ErrClosed, ctx.Err(),
// tokensem.ErrPermissionDenied, or a broker error (wrapping
// tokensem.ErrUnavailable).
func (s *Semaphore) TryAcquire(ctx context.Context) (tokensem.Permit, error) {
	p, err := s.acquire(ctx, true)
	if err != nil {
		return nil, err
	}
	return p, nil
}

// maxTryDeliveries bounds how many unusable deliveries (junk, duplicates,
// tokens held by a live holder), and answers that every ready token is
// promised to a pull queued ahead, TryAcquire looks past before giving up.
const maxTryDeliveries = 16

// acquire is Acquire (noWait false) or TryAcquire, reported to the
// observer.
func (s *Semaphore) acquire(ctx context.Context, noWait bool) (*Permit, error) {
	start := time.Now()
	p, err := s.take(ctx, noWait)
	semopts.ObserveAcquire(s.opts.Observer, s.name, s.Permits(), start, err)
	return p, err
}

func (s *Semaphore) take(ctx context.Context, noWait bool) (*Permit, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if s.isClosed() {
		return nil, tokensem.ErrClosed
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
	w, err := s.getWaiter(!noWait)
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

	// A queued pull hears a heartbeat every heartbeat interval. The first
	// one is awaited briefly: the server drops a pull silently when the
	// waiter queue is full. A later silence of two heartbeats means the
	// pull was lost; a reconnection says so at once.
	hb := s.opts.heartbeat
	firstBeat, idle := hb+hb/2, 2*hb
	timer := time.NewTimer(firstBeat)
	defer timer.Stop()
	var unanswered time.Time // since when pulls find no consumer (503)
	pause := backoff.Backoff{Min: 20 * time.Millisecond, Max: time.Second}
	tries := 0
	// A waiter taken over from a caller that gave up still has its pull
	// queued: Acquire waits on it (its place in the queue).
	adopted := !noWait && w.pending() > 0
	for {
		if adopted {
			adopted = false
			// Its first heartbeat, or the next, is due by the same rule
			// as for a pull of this call's own.
			timer.Reset(max(w.silence(hb), time.Millisecond))
		} else if err := w.pull(noWait); err != nil {
			if noWait || !transient(err) {
				return nil, err
			}
			if err := pause.Wait(ctx, s.done); err != nil {
				return nil, err
			}
			continue
		} else {
			timer.Reset(firstBeat)
		}
	wait:
		for {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-s.done:
				return nil, tokensem.ErrClosed
			case <-timer.C:
				if err := s.checkWaiterQueue(ctx); err != nil {
					return nil, err
				}
				s.log.Debug(reissued, "reason", "silent")
				w.lost()
				break wait
			case <-w.reconnected:
				s.log.Debug(reissued, "reason", "reconnected")
				w.lost()
				break wait
			case m := <-w.ch:
				timer.Reset(idle)
				w.ended(m) // a token or a final status ends a pull
				code, desc := status(m)
				switch code {
				case "":
					if !isDelivery(m) {
						continue // not for us
					}
					unanswered = time.Time{}
					// A claim is short and runs to its end even if ctx
					// ends meanwhile: its outcome must be known.
					gaveUp := ctx.Done()
					if noWait {
						gaveUp = nil // TryAcquire does not wait for a release
					}
					p, err := s.deliver(context.WithoutCancel(ctx), gaveUp, m)
					switch {
					case p != nil:
						return p, nil
					case err != nil && (noWait || !transient(err)):
						return nil, err
					case err != nil:
						s.log.Warn("claim failed; waiting on", "err", err)
						if err := pause.Wait(ctx, s.done); err != nil {
							return nil, err
						}
					default:
						pause.Reset()
					}
					tries++
					if noWait && tries >= maxTryDeliveries {
						return nil, tokensem.ErrNoPermit
					}
					break wait // stepped away: ask again
				case "100": // idle heartbeat
				case "404":
					return nil, tokensem.ErrNoPermit
				case "408":
					if noWait {
						// "Requests Pending": the ready tokens are on their
						// way to pulls queued ahead. Ask again a few times
						// (one may come back, handed back by a caller that
						// gave up), not for ever.
						if tries++; tries >= maxTryDeliveries {
							return nil, tokensem.ErrNoPermit
						}
						break wait
					}
					s.log.Debug(reissued, "reason", "expired")
					break wait // our pull expired: re-issue it
				case "409":
					if isMaxWaiting(desc) {
						return nil, fmt.Errorf("%w: %s", tokensem.ErrTooManyWaiters, desc)
					}
					if err := s.checkConsumer(ctx); err != nil && !transient(err) {
						return nil, err
					}
					s.log.Debug(reissued, "reason", "ended by the server", "status", desc)
					if err := backoff.Sleep(ctx, 10*time.Millisecond); err != nil {
						return nil, err
					}
					break wait
				case "503":
					// No consumer answers the pull: its stream or consumer
					// is electing a leader, JetStream is restarting, or the
					// semaphore was deleted.
					if unanswered.IsZero() {
						unanswered = time.Now()
					}
					if time.Since(unanswered) > s.requestTimeout() {
						err := s.checkConsumer(ctx)
						if err == nil {
							err = wrapBrokerErr(fmt.Errorf("%s: no consumer answers: %w", s.name, nats.ErrNoResponders))
						}
						if noWait || !transient(err) {
							return nil, err
						}
						s.log.Warn("no consumer answers pulls; waiting on", "for", time.Since(unanswered).Round(time.Millisecond), "err", err)
					}
					s.log.Debug(reissued, "reason", "no responders")
					if err := pause.Wait(ctx, s.done); err != nil {
						return nil, err
					}
					break wait
				default:
					return nil, wrapBrokerErr(fmt.Errorf("pull answered %s %s", code, desc))
				}
			}
		}
	}
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

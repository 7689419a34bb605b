package natssem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/backoff"
	"github.com/tokensem/tokensem/internal/ids"
	"github.com/tokensem/tokensem/internal/semopts"
	"github.com/tokensem/tokensem/internal/testhook"
	"github.com/tokensem/tokensem/reconciler"
)

// Acquire blocks until it holds a permit or ctx ends. Callers are served in
// the order they started waiting (one pull request each, queued FIFO by the
// server; a caller waiting longer than the pull expiry re-queues at the
// back). On failure nothing changes: a token delivered to a caller that
// gave up is handed on to the next waiter.
//
// A broker that does not answer for a while (a stream or consumer electing
// a new leader, a server restarting, a lost connection being re-made) does
// not end the wait: Acquire waits on through it until ctx ends.
//
// Errors: ctx.Err(), tokensem.ErrClosed, tokensem.ErrTooManyWaiters,
// tokensem.ErrNotInitialized (the semaphore was deleted), or a broker error
// that waiting cannot cure (wrapping tokensem.ErrUnavailable).
func (s *Semaphore) Acquire(ctx context.Context) (tokensem.Permit, error) {
	p, err := s.acquire(ctx, false)
	if err != nil {
		return nil, err
	}
	return p, nil
}

// TryAcquire takes a free permit or returns tokensem.ErrNoPermit at once.
//
// Errors: tokensem.ErrNoPermit, tokensem.ErrClosed, ctx.Err(), or a broker
// error (wrapping tokensem.ErrUnavailable).
func (s *Semaphore) TryAcquire(ctx context.Context) (tokensem.Permit, error) {
	p, err := s.acquire(ctx, true)
	if err != nil {
		return nil, err
	}
	return p, nil
}

// maxTryDeliveries bounds how many unusable deliveries (junk, duplicates,
// tokens held by a live holder) TryAcquire looks past before giving up.
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
	if noWait {
		s.returned.wait(ctx, s.opts.RequestTimeout)
	}
	w, err := s.getWaiter()
	if err != nil {
		return nil, err
	}
	defer w.finish()

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
	for {
		if err := w.pull(noWait); err != nil {
			if noWait || !transient(err) {
				return nil, err
			}
			if err := pause.Wait(ctx, s.done); err != nil {
				return nil, err
			}
			continue
		}
		timer.Reset(firstBeat)
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
				s.log.Debug("waiting pull went silent; re-issuing it")
				break wait
			case <-w.reconnected:
				s.log.Debug("reconnected; re-issuing the waiting pull")
				break wait
			case m := <-w.ch:
				timer.Reset(idle)
				code, desc := status(m)
				switch code {
				case "":
					if !isDelivery(m) {
						continue // not for us
					}
					w.ended()
					unanswered = time.Time{}
					// A claim is short and runs to its end even if ctx
					// ends meanwhile: its outcome must be known.
					p, err := s.claim(context.WithoutCancel(ctx), m)
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
					w.ended()
					return nil, tokensem.ErrNoPermit
				case "408":
					w.ended()
					break wait // our pull expired: re-issue it
				case "409":
					w.ended()
					if isMaxWaiting(desc) {
						return nil, fmt.Errorf("%w: %s", tokensem.ErrTooManyWaiters, desc)
					}
					if err := s.checkConsumer(ctx); err != nil && !transient(err) {
						return nil, err
					}
					s.log.Debug("pull ended by the server; re-issuing it", "status", desc)
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
					if time.Since(unanswered) > s.opts.RequestTimeout {
						err := s.checkConsumer(ctx)
						if err == nil {
							err = wrapBrokerErr(fmt.Errorf("%s: no consumer answers: %w", s.name, nats.ErrNoResponders))
						}
						if noWait || !transient(err) {
							return nil, err
						}
						s.log.Warn("no consumer answers pulls; waiting on", "for", time.Since(unanswered).Round(time.Millisecond), "err", err)
					}
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

// transient reports whether err is a broker failure that waiting may cure:
// one wrapping tokensem.ErrUnavailable, unless it says the semaphore, the
// connection or JetStream itself is gone for good.
func transient(err error) bool {
	return errors.Is(err, tokensem.ErrUnavailable) &&
		!errors.Is(err, tokensem.ErrNotInitialized) &&
		!errors.Is(err, nats.ErrConnectionClosed) &&
		!errors.Is(err, nats.ErrBadSubscription) &&
		!errors.Is(err, nats.ErrAuthorization) &&
		!errors.Is(err, nats.ErrPermissionViolation) &&
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

// claim turns a delivery into a permit, or steps away from it. It returns a
// permit, (nil, nil) when the caller should ask for another delivery, or an
// error. The slot record decides: a free record is taken by compare-and-set;
// a held record is taken over only when its holder has been silent for a
// whole lease by the server's clock (the holder gave up before that, see
// Permit); otherwise the delivery is a stale redelivery (step away, touch
// nothing) or a duplicate token of a live holder's slot (delete it).
//
// A won write makes a permit only with at least minHold left before its
// deadline; a later one (a slow broker, an election) frees the record again
// and hands the token on, and the caller keeps waiting.
func (s *Semaphore) claim(ctx context.Context, m *nats.Msg) (*Permit, error) {
	meta, err := m.Metadata()
	if err != nil {
		return nil, nil // not a JetStream delivery
	}
	seq := meta.Sequence.Stream
	tok, err := s.admit(ctx, m.Data)
	if err != nil {
		if errors.Is(err, errRetired) {
			s.discard(m, seq, err)
			return nil, nil
		}
		s.giveBack(m)
		return nil, err
	}
	holder := ids.New() // unique id of this acquire
	lease := s.config().Lease
	d := delivery{tok: tok, reply: m.Reply, seq: seq, delivered: meta.NumDelivered, holder: holder}

	cur, ok := s.slots.cached(tok.Index, seq, meta.NumDelivered)
	for attempt := 0; attempt < 5; attempt++ {
		if !ok {
			cur, err = s.slots.read(ctx, tok.Index)
			if err != nil {
				s.giveBack(m) // we wrote nothing: hand it on
				return nil, err
			}
		}
		ok = false // any retry reads the record afresh
		if cur.rec.Deleted {
			// Delete closed the slot: the semaphore goes away, or comes
			// back if the delete is refused. Wait on either way.
			s.log.Debug("delivery of a token of a slot being deleted; stepping away", "index", tok.Index)
			s.holdBack(m)
			return nil, nil
		}
		if !cur.rec.free() {
			now, err := s.serverNow(ctx)
			if err != nil {
				s.giveBack(m)
				return nil, err
			}
			if cur.live(now, lease) {
				if cur.rec.Seq == seq {
					s.log.Debug("delivery of a token held by a live holder; stepping away", "index", tok.Index, "holder", cur.rec.Owner)
					return nil, nil
				}
				s.log.Warn("deleting a duplicate token of a held slot", "index", tok.Index, "seq", seq, "held_seq", cur.rec.Seq)
				s.deleteDuplicate(ctx, seq)
				return nil, nil
			}
			s.log.Info("taking over the slot of a silent holder", "index", tok.Index, "holder", cur.rec.Owner, "silent", now.Sub(cur.written))
		}
		d.rec = record{Holder: holder, Owner: s.opts.HolderName, Seq: seq, Token: tok.ID}
		d.sent = time.Now()
		// A write answered after the last useful instant makes no permit:
		// wait for it no longer than that.
		wctx, cancel := context.WithDeadline(ctx, d.lastUseful(lease))
		rev, err := s.slots.cas(wctx, tok.Index, d.rec, cur.rev, meta.NumDelivered)
		cancel()
		switch {
		case err == nil:
			if !cur.rec.free() && cur.rec.Seq != seq {
				s.deleteDuplicate(ctx, cur.rec.Seq) // the silent holder's copy is now a duplicate
			}
			return s.won(ctx, m, d, rev, lease)
		case errors.Is(err, errConflict):
			continue // someone wrote first: re-read and decide again
		default:
			// Outcome unknown: find out whether our write landed.
			rctx, cancel := context.WithDeadline(ctx, d.lastUseful(lease))
			got, rerr := s.slots.read(rctx, tok.Index)
			cancel()
			switch {
			case rerr == nil && got.rec.Holder == holder:
				return s.won(ctx, m, d, got.rev, lease)
			case rerr == nil:
				s.giveBack(m) // our write did not land
			}
			// Otherwise the outcome stays unknown: touch nothing. If our write
			// landed, the record ages out and the token returns in a lease.
			return nil, err
		}
	}
	return nil, nil
}

// delivery is a token delivery being claimed, and the record written for
// it.
type delivery struct {
	tok       tokensem.Token
	reply     string // the delivery's ack subject
	seq       uint64 // the token's stream sequence
	delivered uint64 // the token's delivery count
	holder    string // unique id of this acquire
	rec       record // the record written to claim the slot
	sent      time.Time
}

// lastUseful is the last instant at which a claim write sent at d.sent can
// still make a permit.
func (d delivery) lastUseful(lease time.Duration) time.Time {
	return deadline(d.sent, lease).Add(-minHold(lease))
}

// won makes a permit of a delivery whose claim write landed at revision
// rev, if enough of its lease is left; otherwise it frees the record again
// and hands the token on, and the caller keeps waiting.
func (s *Semaphore) won(ctx context.Context, m *nats.Msg, d delivery, rev uint64, lease time.Duration) (*Permit, error) {
	if late := time.Since(d.lastUseful(lease)); late > 0 {
		s.log.Warn("claim answered too late to hold the permit; handing the token on", "index", d.tok.Index, "late", late)
		free := record{Seq: d.seq, Token: d.tok.ID, By: d.holder}
		if _, err := s.slots.cas(context.WithoutCancel(ctx), d.tok.Index, free, rev, d.delivered); err == nil {
			s.giveBack(m)
		}
		// Otherwise the record ages out and the token returns in a lease.
		return nil, nil
	}
	// Restart the server's ack timer now, after the record write, so the
	// token cannot be redelivered before the record is a whole lease old
	// (which would make the next receiver step away).
	if err := s.nc.Publish(m.Reply, ackProgress); err != nil {
		s.log.Debug("in-progress after claim failed", "err", err)
	}
	return s.newPermit(d, rev, lease), nil
}

// errRetired marks a delivery that is not a usable token of this semaphore.
var errRetired = errors.New("natssem: not a current token")

// admit parses and checks a delivered token against the configuration
// (see reconciler.Admit): a token that is not a current one of this
// semaphore is errRetired.
func (s *Semaphore) admit(ctx context.Context, data []byte) (tokensem.Token, error) {
	e, err := reconciler.Admit(s.codec, s.name, data, func(fresh bool) (int, uint64, error) {
		read := s.freshConfig
		if fresh {
			read = s.refreshConfig
		}
		cfg, err := read(ctx)
		return cfg.Permits, cfg.Epoch, err
	})
	switch {
	case err != nil:
		return tokensem.Token{}, err
	case !e.Valid:
		return tokensem.Token{}, fmt.Errorf("%w: %s token %s", errRetired, e.Reason, e.Token)
	}
	return e.Token, nil
}

// discard removes a delivery that can never be a permit (junk, forged, of
// another semaphore, or retired by a resize). Acking removes it from the
// work queue; the delivery is ours, and it holds no slot.
func (s *Semaphore) discard(m *nats.Msg, seq uint64, why error) {
	s.log.Warn("removing an invalid token message", "seq", seq, "reason", why)
	if err := s.nc.Publish(m.Reply, ackAck); err != nil {
		s.log.Warn("could not remove an invalid token message", "seq", seq, "err", err)
	}
}

func (s *Semaphore) deleteDuplicate(ctx context.Context, seq uint64) {
	if err := s.deleteMsg(ctx, seq); err != nil {
		s.log.Warn("could not delete a duplicate token", "seq", seq, "err", err)
	}
}

// deleteMsg deletes the token message at stream sequence seq; a message
// that is already gone (deleted by another client) is no error. The request
// is made here rather than with jetstream's Stream.DeleteMsg, which keeps
// only the text of the server's error and so hides its code.
func (s *Semaphore) deleteMsg(ctx context.Context, seq uint64) error {
	rctx, cancel := s.rtt(ctx)
	defer cancel()
	req := mustMarshal(struct {
		Seq     uint64 `json:"seq"`
		NoErase bool   `json:"no_erase"`
	}{seq, true})
	m, err := s.nc.RequestWithContext(rctx, "$JS.API.STREAM.MSG.DELETE."+StreamName(s.name), req)
	if err != nil {
		return wrapBrokerErr(err)
	}
	var resp struct {
		Success bool                `json:"success"`
		Error   *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return wrapBrokerErr(fmt.Errorf("deleting token message %d: %w", seq, err))
	}
	switch {
	case resp.Success, isAPIError(resp.Error, jsNoMessageFound, jsSequenceNotFound):
		return nil
	case resp.Error != nil:
		return wrapBrokerErr(fmt.Errorf("deleting token message %d: %w", seq, resp.Error))
	}
	return wrapBrokerErr(fmt.Errorf("deleting token message %d: not deleted", seq))
}

// serverNow returns the server's current time (from consumer info), the
// clock that stamps KV entries: a record's age is measured on the server's
// clock alone, so client clocks play no part in a takeover.
func (s *Semaphore) serverNow(ctx context.Context) (time.Time, error) {
	info, err := s.consumerInfo(ctx)
	if err != nil {
		return time.Time{}, err
	}
	return info.TimeStamp.Add(testhook.ServerClockAhead()), nil
}

// consumerInfo reads the holders consumer's info: one round trip (the
// lookup returns it). A missing stream or consumer is
// tokensem.ErrNotInitialized; other failures are broker errors.
func (s *Semaphore) consumerInfo(ctx context.Context) (*jetstream.ConsumerInfo, error) {
	rctx, cancel := s.rtt(ctx)
	defer cancel()
	c, err := s.js.Consumer(rctx, StreamName(s.name), consumerName)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound), errors.Is(err, jetstream.ErrConsumerNotFound):
		return nil, fmt.Errorf("%w: %s: %w", tokensem.ErrNotInitialized, s.name, err)
	case err != nil:
		return nil, wrapBrokerErr(err)
	}
	return c.CachedInfo(), nil
}

package natssem

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem"
)

// Acquire blocks until it holds a permit or ctx ends. Callers are served in
// the order they started waiting (one pull request each, queued FIFO by the
// server; a caller waiting longer than the pull expiry re-queues at the
// back). On failure nothing changes: a token delivered to a caller that
// gave up is handed on to the next waiter.
//
// Errors: ctx.Err(), tokensem.ErrClosed, tokensem.ErrTooManyWaiters, or a
// wrapped broker error.
func (s *Semaphore) Acquire(ctx context.Context) (tokensem.Permit, error) {
	p, err := s.acquire(ctx, false)
	if err != nil {
		return nil, err
	}
	return p, nil
}

// TryAcquire takes a free permit or returns tokensem.ErrNoPermit at once.
//
// Errors: tokensem.ErrNoPermit, tokensem.ErrClosed, ctx.Err(), or a wrapped
// broker error.
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
	tokensem.ObserveAcquire(s.opts.Observer, s.name, s.Permits(), start, err)
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
	// waiter queue is full. Later silences (a restarted server, a lost
	// request) get more slack.
	hb := s.opts.heartbeat
	firstBeat, idle := hb+hb/2, 3*hb
	timer := time.NewTimer(firstBeat)
	defer timer.Stop()
	var noResponders time.Time
	tries := 0
	for {
		if err := w.pull(noWait); err != nil {
			return nil, err
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
			case m := <-w.ch:
				timer.Reset(idle)
				code, desc := status(m)
				switch code {
				case "":
					if !isDelivery(m) {
						continue // not for us
					}
					w.ended()
					noResponders = time.Time{}
					// A claim is short and runs to its end even if ctx
					// ends meanwhile: its outcome must be known.
					p, err := s.claim(context.WithoutCancel(ctx), m)
					if p != nil || err != nil {
						return p, err
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
					s.log.Debug("pull ended by the server; re-issuing it", "status", desc)
					if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
						return nil, err
					}
					break wait
				case "503":
					if noResponders.IsZero() {
						noResponders = time.Now()
					} else if time.Since(noResponders) > s.opts.RequestTimeout {
						return nil, fmt.Errorf("natssem: %s: no consumer answers (semaphore deleted or JetStream down): %w",
							s.name, nats.ErrNoResponders)
					}
					if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
						return nil, err
					}
					break wait
				default:
					return nil, fmt.Errorf("natssem: pull answered %s %s", code, desc)
				}
			}
		}
	}
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

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// claim turns a delivery into a permit, or steps away from it. It returns a
// permit, (nil, nil) when the caller should ask for another delivery, or an
// error. The slot record decides: a free record is taken by compare-and-set;
// a held record is taken over only when its holder has been silent for a
// whole lease by the server's clock (the holder gave up before that, see
// Permit); otherwise the delivery is a stale redelivery (step away, touch
// nothing) or a duplicate token of a live holder's slot (delete it).
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
	holder := tokensem.NewToken(s.name, 0, 1).ID // unique id of this acquire
	cfg := s.config()

	cached, ok := s.cached(tok.Index, seq, meta.NumDelivered)
	for attempt := 0; attempt < 5; attempt++ {
		if !ok {
			cached, err = s.readRecord(ctx, tok.Index)
			if err != nil {
				s.giveBack(m) // we wrote nothing: hand it on
				return nil, err
			}
		}
		ok = false // any retry reads the record afresh
		rec := cached.rec
		if !rec.free() {
			now, err := s.serverNow(ctx)
			if err != nil {
				s.giveBack(m)
				return nil, err
			}
			age := now.Sub(cached.written)
			if age < cfg.Lease {
				if rec.Seq == seq {
					s.log.Debug("delivery of a token held by a live holder; stepping away", "index", tok.Index, "holder", rec.Owner)
					return nil, nil
				}
				s.log.Warn("deleting a duplicate token of a held slot", "index", tok.Index, "seq", seq, "held_seq", rec.Seq)
				s.deleteMsg(ctx, seq)
				return nil, nil
			}
			s.log.Info("taking over the slot of a silent holder", "index", tok.Index, "holder", rec.Owner, "silent", age)
		}
		want := record{Holder: holder, Owner: s.opts.HolderName, Seq: seq, Token: tok.ID}
		sent := time.Now()
		rev, err := s.cas(ctx, tok.Index, want, cached.rev, meta.NumDelivered)
		switch {
		case err == nil:
			// Restart the server's ack timer now, after the record write, so
			// the token cannot be redelivered before the record is a whole
			// lease old (which would make the next receiver step away).
			if err := s.nc.Publish(m.Reply, ackProgress); err != nil {
				s.log.Debug("in-progress after claim failed", "err", err)
			}
			if !rec.free() && rec.Seq != seq {
				s.deleteMsg(ctx, rec.Seq) // the silent holder's copy is now a duplicate
			}
			return s.newPermit(won{tok, m.Reply, seq, meta.NumDelivered, holder, want, rev, sent, cfg.Lease}), nil
		case errors.Is(err, jetstream.ErrKeyExists):
			continue // someone wrote first: re-read and decide again
		default:
			// Outcome unknown: find out whether our write landed.
			got, rerr := s.readRecord(ctx, tok.Index)
			switch {
			case rerr == nil && got.rec.Holder == holder:
				_ = s.nc.Publish(m.Reply, ackProgress)
				return s.newPermit(won{tok, m.Reply, seq, meta.NumDelivered, holder, want, got.rev, sent, cfg.Lease}), nil
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

// errRetired marks a delivery that is not a usable token of this semaphore.
var errRetired = errors.New("natssem: not a current token")

// admit parses and checks a delivered token against the configuration,
// re-reading it once before calling a token retired (a resize may have
// changed it).
func (s *Semaphore) admit(ctx context.Context, data []byte) (tokensem.Token, error) {
	tok, err := s.codec.Decode(data)
	if err != nil {
		return tokensem.Token{}, fmt.Errorf("%w: %w", errRetired, err)
	}
	if tok.Semaphore != s.name {
		return tokensem.Token{}, fmt.Errorf("%w: token of semaphore %q", errRetired, tok.Semaphore)
	}
	cfg, err := s.freshConfig(ctx)
	if err != nil {
		return tokensem.Token{}, err
	}
	if tok.Index < cfg.Permits && tok.Epoch == cfg.Epoch {
		return tok, nil
	}
	if cfg, err = s.refreshConfig(ctx); err != nil {
		return tokensem.Token{}, err
	}
	if tok.Index < cfg.Permits && tok.Epoch == cfg.Epoch {
		return tok, nil
	}
	return tokensem.Token{}, fmt.Errorf("%w: %s (permits %d, epoch %d)", errRetired, tok, cfg.Permits, cfg.Epoch)
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

func (s *Semaphore) deleteMsg(ctx context.Context, seq uint64) {
	rctx, cancel := s.rtt(ctx)
	defer cancel()
	if err := s.stream.DeleteMsg(rctx, seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		s.log.Warn("could not delete a duplicate token", "seq", seq, "err", err)
	}
}

// cached returns the record this client last wrote for a slot, when it can
// be trusted without a read: it freed the slot releasing this very message
// (seq), and this delivery is the next one of that message, so nobody else
// had the token in between and the record cannot have changed. Anything else
// (another client held it since, a duplicate) needs a fresh read.
func (s *Semaphore) cached(index int, seq, delivered uint64) (cachedRecord, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.cache[index]
	return c, ok && c.rec.free() && c.rec.Seq == seq && c.delivered != 0 && c.delivered+1 == delivered
}

// remember records what this client wrote or read for a slot. delivered is
// the delivery count of the token when we wrote (0 for reads).
func (s *Semaphore) remember(index int, rec record, rev, delivered uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.cache[index]; !ok || c.rev < rev {
		s.cache[index] = cachedRecord{rec: rec, rev: rev, delivered: delivered}
	}
}

func (s *Semaphore) readRecord(ctx context.Context, index int) (cachedRecord, error) {
	rctx, cancel := s.rtt(ctx)
	defer cancel()
	e, err := s.kv.Get(rctx, slotKey(index))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return cachedRecord{}, nil // never held: free at revision 0
	case err != nil:
		return cachedRecord{}, wrapBrokerErr(err)
	}
	rec, err := decodeRecord(e.Value())
	if err != nil {
		// A corrupt record is treated as held by nobody we know; only a
		// compare-and-set against its revision can replace it.
		s.log.Warn("corrupt slot record", "index", index, "err", err)
		rec = record{}
	}
	c := cachedRecord{rec: rec, rev: e.Revision(), written: e.Created()}
	s.remember(index, rec, e.Revision(), 0)
	return c, nil
}

// cas writes rec to the slot's record if its last revision is still rev
// (0: the record must not exist). It returns the new revision (the fence),
// or an error wrapping jetstream.ErrKeyExists when someone else wrote first.
// Callers that must learn the outcome even after their caller gave up pass
// a context.WithoutCancel.
func (s *Semaphore) cas(ctx context.Context, index int, rec record, rev, delivered uint64) (uint64, error) {
	rctx, cancel := s.rtt(ctx)
	defer cancel()
	newRev, err := s.kv.Update(rctx, slotKey(index), rec.encode(), rev)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return 0, err
		}
		return 0, wrapBrokerErr(err)
	}
	s.remember(index, rec, newRev, delivered)
	return newRev, nil
}

// serverNow returns the server's current time (from consumer info), the
// clock that stamps KV entries: a record's age is measured on the server's
// clock alone, so client clocks play no part in a takeover.
func (s *Semaphore) serverNow(ctx context.Context) (time.Time, error) {
	info, err := s.consumerInfo(ctx)
	if err != nil {
		return time.Time{}, wrapBrokerErr(err)
	}
	return info.TimeStamp, nil
}

// consumerInfo reads the holders consumer's info: one round trip (the
// lookup returns it).
func (s *Semaphore) consumerInfo(ctx context.Context) (*jetstream.ConsumerInfo, error) {
	rctx, cancel := s.rtt(ctx)
	defer cancel()
	c, err := s.js.Consumer(rctx, StreamName(s.name), consumerName)
	if err != nil {
		return nil, err
	}
	return c.CachedInfo(), nil
}

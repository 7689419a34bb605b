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
	"github.com/tokensem/tokensem/reconciler"
)

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
//
// ctx bounds nothing but round trips (a claim runs to its end); gaveUp
// closes when the caller stops waiting, which ends a wait for a release
// (awaitRelease). A nil gaveUp (TryAcquire, which returns at once) does not
// wait for a release.
func (s *Semaphore) claim(ctx context.Context, gaveUp <-chan struct{}, m *nats.Msg) (*Permit, error) {
	meta, err := m.Metadata()
	if err != nil {
		return nil, nil // not a JetStream delivery
	}
	seq := meta.Sequence.Stream
	tok, err := s.admit(ctx, m.Data)
	if err != nil {
		if errors.Is(err, reconciler.ErrNotCurrent) {
			s.discard(ctx, m, seq, err)
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
					// Most often its holder released it and this read
					// came from a replica that has not applied the free
					// write yet (awaitRelease).
					if gaveUp != nil {
						s.log.Debug("token delivered before its release was visible; awaiting the free record", "index", tok.Index, "rev", cur.rev)
						next, changed, err := s.awaitRelease(ctx, gaveUp, tok.Index, cur)
						switch {
						case err != nil:
							s.giveBack(m)
							return nil, err
						case changed:
							cur, ok = next, true
							continue
						case chanClosed(gaveUp):
							s.giveBack(m) // the caller left: hand it on
							return nil, nil
						}
					}
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

// awaitRelease waits for a slot record that a delivery of the very token
// it names found held by a live holder (held) to change hands. A release
// writes the free record before its Nak, but on a replicated bucket the
// read is a direct get that any replica may answer, and one replica may
// apply an acknowledged write a few milliseconds after the quorum did
// (docs/nats-cluster-facts.md): stepping away then would leave the token
// unused until the server redelivers it, a whole lease later. The record is
// read again as replicaWait says. An older revision (a replica further
// behind) and the same holder's renewal do not count as a change. changed
// is false if nothing changed by then (a token redelivered by a stale Nak while its holder
// lives: the caller steps away) or if gaveUp closed first.
func (s *Semaphore) awaitRelease(ctx context.Context, gaveUp <-chan struct{}, index int, held slotEntry) (e slotEntry, changed bool, err error) {
	bound, pause := s.replicaWait()
	limit, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	for { // the first read follows at once
		got, err := s.slots.read(ctx, index)
		switch {
		case err != nil:
			return slotEntry{}, false, err
		case got.rev > held.rev && (got.rec.Holder != held.rec.Holder || got.rec.Seq != held.rec.Seq || got.rec.Deleted):
			return got, true, nil
		}
		if pause.Wait(limit, gaveUp) != nil { // the limit passed, or the caller left
			return slotEntry{}, false, nil
		}
	}
}

// replicaWait is how long, and at what pace, a client reads again a slot
// record that a replica may not have caught up on yet (awaitRelease,
// Permit.write): 100 µs doubling to 20 ms, jittered, for up to the request
// timeout or s.releaseWait, whichever is shorter.
func (s *Semaphore) replicaWait() (time.Duration, backoff.Backoff) {
	return min(s.opts.RequestTimeout, s.releaseWait), backoff.Backoff{Min: 100 * time.Microsecond, Max: 20 * time.Millisecond}
}

// maxReleaseWait bounds awaitRelease: far longer than a replica takes to
// apply a write, short enough that a caller handed a token its live holder
// still has (which steps it away in the end) loses little.
const maxReleaseWait = time.Second

func chanClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
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

// admit checks a delivered token against the configuration (see
// reconciler.Admit): a token that is not a current one of this semaphore
// is an error wrapping reconciler.ErrNotCurrent.
func (s *Semaphore) admit(ctx context.Context, data []byte) (tokensem.Token, error) {
	return reconciler.Admit(s.codec, s.name, data, func(fresh bool) (int, uint64, error) {
		read := s.freshConfig
		if fresh {
			read = s.refreshConfig
		}
		cfg, err := read(ctx)
		return cfg.Permits, cfg.Epoch, err
	})
}

// discard removes a delivery that can never be a permit (junk, forged, of
// another semaphore, or retired by a resize). Acking removes it from a
// work queue; the delivery is ours, and it holds no slot. A group's stream
// keeps acknowledged messages (see createGroupStream), so there it is
// deleted too.
func (s *Semaphore) discard(ctx context.Context, m *nats.Msg, seq uint64, why error) {
	s.log.Warn("removing an invalid token message", "seq", seq, "reason", why)
	if err := s.nc.Publish(m.Reply, ackAck); err != nil {
		s.log.Warn("could not remove an invalid token message", "seq", seq, "err", err)
	}
	if s.lay.grouped() {
		if err := s.deleteMsg(ctx, seq); err != nil {
			s.log.Warn("could not delete an invalid token message", "seq", seq, "err", err)
		}
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
	m, err := s.nc.RequestWithContext(rctx, "$JS.API.STREAM.MSG.DELETE."+s.lay.stream, req)
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

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
	"github.com/tokensem/tokensem/driver"
	"github.com/tokensem/tokensem/internal/backoff"
	"github.com/tokensem/tokensem/internal/ids"
)

// claim turns an admitted delivery into a permit, or steps away from it.
// It returns a permit, (nil, nil) when the caller should ask for another
// delivery, or an error. The slot record decides: a free record is taken by
// compare-and-set; a held record is taken over only when its holder has
// been silent for a whole lease by the server's clock (the holder gave up
// before that, see Permit); otherwise the delivery is a stale redelivery
// (step away, touch nothing) or a duplicate token of a live holder's slot
// (delete it). lease is that of the token's own life (admit).
//
// A won write makes a permit only with at least minHold left before its
// deadline; a later one (a slow broker, an election) frees the record again
// and hands the token on, and the caller keeps waiting.
//
// ctx bounds nothing but round trips (a claim runs to its end); gaveUp
// closes when the caller stops waiting, which ends a wait for a release
// (awaitRelease). A nil gaveUp (TryAcquire, which returns at once) does not
// wait for a release.
func (s *Semaphore) claim(ctx context.Context, gaveUp <-chan struct{}, m *nats.Msg, d delivery, lease time.Duration) (*Permit, error) {
	tok, seq := d.tok, d.seq
	holder := ids.New() // unique id of this acquire
	d.holder = holder
	var err error
	cur, ok := s.slots.cached(tok.Index, tok.Epoch, seq, d.delivered)
	for attempt := 0; attempt < 5; attempt++ {
		if !ok {
			cur, err = s.slots.read(ctx, tok.Index)
			if err != nil {
				s.giveBack(m) // we wrote nothing: hand it on
				return nil, err
			}
		}
		ok = false // any retry reads the record afresh
		act, err := s.judge(ctx, tok, seq, cur, lease)
		switch {
		case err != nil:
			s.giveBack(m)
			return nil, err
		case act == ended:
			s.discard(ctx, m, seq, fmt.Errorf("%w: token of an ended life of %s", driver.ErrNotCurrent, s.name))
			return nil, nil
		case act == closed:
			// Delete closed the slot: the semaphore goes away, or comes
			// back if the delete is refused. Wait on either way.
			s.log.Debug("delivery of a token of a slot being deleted; stepping away", "index", tok.Index)
			s.holdBack(m)
			return nil, nil
		case act == duplicate:
			s.log.Warn("deleting a duplicate token of a held slot", "index", tok.Index, "seq", seq, "held_seq", cur.rec.Seq)
			s.deleteDuplicate(ctx, seq)
			return nil, nil
		case act == heldWithout:
			// Deleting this token could leave the slot none; taking the
			// slot over could make a second holder of a real one whose
			// token someone removed. Leave it (it comes back after the
			// ack wait) until the record frees or falls a lease silent.
			s.log.Warn("slot record names a token the stream does not hold (forged, or its token was removed); leaving this token",
				"index", tok.Index, "seq", seq, "named_seq", cur.rec.Seq, "holder", cur.rec.Owner)
			return nil, nil
		case act == heldHere && gaveUp != nil:
			// Most often its holder released it and this read came from
			// a replica that has not applied the free write yet
			// (awaitRelease).
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
			fallthrough
		case act == heldHere:
			s.log.Debug("delivery of a token held by a live holder; stepping away", "index", tok.Index, "holder", cur.rec.Owner)
			return nil, nil
		}
		// A record never written cannot tell which life its bucket is in:
		// the claim is written as unconfirmed and confirmed after (see
		// lifeChecked).
		unconfirmed := cur.rev == 0
		d.rec = record{Epoch: tok.Epoch, Holder: holder, Owner: s.opts.HolderName, Seq: seq, Token: tok.ID, Pending: unconfirmed}
		d.sent = time.Now()
		// A write answered after the last useful instant makes no permit:
		// wait for it no longer than that.
		wctx, cancel := context.WithDeadline(ctx, d.lastUseful(lease))
		rev, err := s.slots.cas(wctx, tok.Index, d.rec, cur.rev, d.delivered)
		cancel()
		switch {
		case err == nil:
			if unconfirmed {
				if done, err := s.confirmClaim(ctx, m, &d, rev); done || err != nil {
					return nil, err
				}
			}
			if act == takeOver && cur.rec.Seq != seq {
				s.deleteSilentCopy(ctx, tok, cur.rec.Seq)
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
				if unconfirmed {
					if done, err := s.confirmClaim(ctx, m, &d, got.rev); done || err != nil {
						return nil, err
					}
				}
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

// action is what a claim does with a delivery, given its slot's record
// (judge).
type action int

const (
	claimFree   action = iota // the record is free (or binds nobody): claim it
	takeOver                  // its holder has been silent a whole lease: claim it
	heldHere                  // a live holder holds this very token: step away
	duplicate                 // a live holder holds another copy: delete this one
	heldWithout               // a live record names no token of the slot: step away
	closed                    // Delete closed the slot: hold the token back
	ended                     // the token's life has ended: remove it
)

// judge decides what a claim of tok (stream sequence seq, its life's lease)
// does, given its slot's record cur (see claim, and lifeChecked below). A
// record of another life binds nobody and is claimed as if free.
func (s *Semaphore) judge(ctx context.Context, tok tokensem.Token, seq uint64, cur slotEntry, lease time.Duration) (action, error) {
	if cur.rev != 0 && !cur.byHolderOf(tok.Epoch) {
		// Not written by a holder of this token's life: a record of
		// another life, or one an admin path or an unconfirmed claim
		// wrote. Is the token's life the current one?
		switch life, _, err := s.lifeOf(ctx, tok); {
		case err != nil:
			return 0, err
		case life == lifeEnded:
			return ended, nil
		case life == lifeEnding:
			return closed, nil // a Delete may yet be refused: wait
		case !cur.ofLife(tok.Epoch):
			// A leftover of a client that acted on an ended life. The
			// claim's compare-and-set replaces it only if it is still
			// there, in this life's records (revisions never repeat
			// across lives).
			return claimFree, nil
		}
	}
	if cur.rec.Deleted {
		// Honoured only while the configuration says a Delete runs: it
		// marks the configuration before it closes a slot, and a refused
		// one reopens the slots before it unmarks it. Anyone who may
		// write slot records can write the mark; in a life that no
		// Delete ends, it is junk, and the record is judged without it.
		switch life, _, err := s.lifeOf(ctx, tok); {
		case err != nil:
			return 0, err
		case life == lifeEnded:
			return ended, nil
		case life == lifeEnding:
			return closed, nil
		}
		s.log.Warn("slot record marked deleted while no Delete runs; judging it unmarked", "index", tok.Index, "rev", cur.rev)
		cur.rec.Deleted = false
	}
	if cur.rec.free() {
		return claimFree, nil
	}
	now, err := s.serverNow(ctx)
	switch {
	case err != nil:
		return 0, err
	case !cur.live(now, lease):
		s.log.Info("taking over the slot of a silent holder", "index", tok.Index, "holder", cur.rec.Owner, "silent", now.Sub(cur.written))
		return takeOver, nil
	case cur.rec.Seq == seq:
		return heldHere, nil
	}
	// Another sequence: a duplicate, if the one the record names is a
	// token of this slot and life still in the stream. Anyone who may
	// write slot records can name any sequence, so that is checked before
	// this token is deleted.
	switch named, err := s.tokenLives(ctx, cur.rec.Seq, tok); {
	case err != nil:
		return 0, err
	case !named:
		return heldWithout, nil
	}
	return duplicate, nil
}

// tokenLives reports whether the stream holds, at stream sequence seq, a
// token of tok's slot and life (checked by the codec, signature and all):
// what a held slot record names when it is real. A record naming anything
// else was forged, or its token was removed behind its holder's back (an
// ack or a message delete by someone else). The read is a direct get, which
// on a replicated stream any replica may answer; one behind could miss only
// a message published a moment ago, so callers take false for the side on
// which they delete nothing.
func (s *Semaphore) tokenLives(ctx context.Context, seq uint64, tok tokensem.Token) (bool, error) {
	if seq == 0 {
		return false, nil
	}
	rctx, cancel := s.rtt(ctx)
	defer cancel()
	req := mustMarshal(struct {
		Seq uint64 `json:"seq"`
	}{seq})
	m, err := s.nc.RequestWithContext(rctx, "$JS.API.DIRECT.GET."+s.lay.stream, req)
	if err != nil {
		return false, wrapBrokerErr(fmt.Errorf("reading token message %d: %w", seq, err))
	}
	switch code, desc := status(m); code {
	case "":
	case "404":
		return false, nil
	default:
		return false, wrapBrokerErr(fmt.Errorf("reading token message %d: answered %s %s", seq, code, desc))
	}
	if m.Header.Get("Nats-Subject") != s.lay.subject {
		return false, nil // another key's message, in a group's stream
	}
	got, err := s.codec.Decode(m.Data)
	return err == nil && got.Semaphore == s.name && got.Index == tok.Index && got.Epoch == tok.Epoch, nil
}

// deleteSilentCopy deletes, after a takeover of tok's slot by another
// message, the message the silent holder's record named, if it is a token
// of the same slot and life: a duplicate now. A record can name any
// sequence (see tokenLives): another slot's token is left alone.
func (s *Semaphore) deleteSilentCopy(ctx context.Context, tok tokensem.Token, seq uint64) {
	switch named, err := s.tokenLives(ctx, seq, tok); {
	case err != nil:
		s.log.Warn("could not read the token a taken-over record named; leaving it", "seq", seq, "err", err)
	case named:
		s.deleteDuplicate(ctx, seq) // the silent holder's copy is now a duplicate
	default:
		s.log.Warn("a taken-over record named no token of its slot; nothing deleted", "index", tok.Index, "named_seq", seq)
	}
}

// The lives of a semaphore's slot records (lifeChecked).
//
// A Delete ends a life and an Init begins the next, while clients that
// read the old configuration may still be admitting its tokens, or be
// paused between admitting a token and claiming its slot. The records of
// the new life are in a new bucket (a semaphore of its own) or under the
// key's purged and rewritten records (a key of a group), so a claim's
// compare-and-set against a revision it read can only land in the life it
// read it from: revisions never repeat across lives (the bucket's
// sequence starts above the previous life's; see createResources). Two
// cases are left, and a claim checks the configuration (currentLife, a
// read from the bucket's stream leader) in each:
//   - the record was not written by a permit holder of the token's life
//     (byHolderOf): a record of another life, or one an admin path wrote
//     (a reconcile's issue, a delete), or an unconfirmed claim. The check
//     comes before the claim's write; a token of an ended life is removed,
//     and a record of an ended life is replaced as if free.
//   - the record was never written (revision 0): a write that creates it
//     could land in any life. The claim writes it marked Pending and
//     checks after (confirmClaim); if its life has ended it writes the
//     record over as belonging to no life (epoch 0) and removes the token.
//     The holder's first renewal clears the mark.
// A permit is therefore only ever handed out in the token's own life, by
// its own configuration's count and lease.

// byHolderOf reports whether the entry was written by a permit holder of
// the life epoch names: a claim, renewal or release (which wrote Holder or
// By with a holder's id), confirmed. Records a reconcile or a Delete wrote
// name no holder of their own.
func (e slotEntry) byHolderOf(epoch uint64) bool {
	return e.rev != 0 && e.rec.Epoch == epoch && !e.rec.Pending && (e.rec.Holder != "" || ids.Valid(e.rec.By))
}

// lifeState is where a token's life stands.
type lifeState int

const (
	lifeCurrent lifeState = iota
	lifeEnding            // the current life, marked for deletion
	lifeEnded             // another life is current, or none
)

// lifeOf reads the configuration afresh from the bucket's stream leader
// (and caches it: a handle that meets a newer life adopts it) and says
// where tok's life stands.
func (s *Semaphore) lifeOf(ctx context.Context, tok tokensem.Token) (lifeState, config, error) {
	cfg, err := s.refreshConfig(ctx)
	switch {
	case errors.Is(err, tokensem.ErrNotInitialized):
		return lifeEnded, config{}, nil
	case err != nil:
		return 0, config{}, err
	case cfg.Epoch != tok.Epoch:
		return lifeEnded, cfg, nil
	case cfg.State == stateDeleting:
		return lifeEnding, cfg, nil
	}
	return lifeCurrent, cfg, nil
}

// confirmClaim checks, after a claim created the slot's record at rev
// (marked Pending), that the token's life is the current one, not being
// deleted, and counts its slot: a Delete closes the slots it can find, and
// a slot above the count that nobody ever held has no record to close. done
// is true when the check fails (or cannot be made): the record is written
// over as belonging to no life, the token is removed (an ended life, a
// retired slot), held back (a Delete under way, which may be refused) or
// handed on (an error), and the claim makes no permit. Otherwise the
// permit's renewals write the record unmarked.
func (s *Semaphore) confirmClaim(ctx context.Context, m *nats.Msg, d *delivery, rev uint64) (done bool, err error) {
	life, cfg, err := s.lifeOf(ctx, d.tok)
	if err == nil && life == lifeCurrent && d.tok.Index < cfg.Permits {
		d.rec.Pending = false
		return false, nil
	}
	// No life's: whoever reads it next checks the configuration.
	if _, uerr := s.slots.cas(context.WithoutCancel(ctx), d.tok.Index, record{Seq: d.seq, By: "unclaimed"}, rev, 0); uerr != nil {
		s.log.Warn("could not undo an unconfirmed claim; it ages out in a lease", "index", d.tok.Index, "err", uerr)
	}
	switch {
	case err != nil:
		s.giveBack(m)
		return true, err
	case life == lifeEnding:
		s.log.Debug("claim of a slot of a semaphore being deleted; undone", "index", d.tok.Index)
		s.holdBack(m)
	case life == lifeEnded:
		s.log.Info("a token of an ended life claimed a record of the current one; undone", "index", d.tok.Index, "epoch", d.tok.Epoch)
		s.discard(ctx, m, d.seq, fmt.Errorf("%w: token of an ended life of %s", driver.ErrNotCurrent, s.name))
	default:
		s.discard(ctx, m, d.seq, fmt.Errorf("%w: retired token %s (the semaphore has %d permits)", driver.ErrNotCurrent, d.tok, cfg.Permits))
	}
	return true, nil
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
	return min(s.requestTimeout(), s.releaseWait), backoff.Backoff{Min: 100 * time.Microsecond, Max: 20 * time.Millisecond}
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
		free := record{Epoch: d.tok.Epoch, Seq: d.seq, Token: d.tok.ID, By: d.holder}
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

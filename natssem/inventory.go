package natssem

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/driver"
)

var _ driver.Inventory = (*Inventory)(nil)

// Inventory is the reconciler's view of a NATS semaphore: a census of every
// token message (held ones included, read by direct get) and of the slot
// lease records.
type Inventory struct {
	s *Semaphore

	mu    sync.Mutex
	slots map[int]slotEntry // slot records as of the latest Census
	now   time.Time         // server time of the latest Census
	cfg   config
	hold  *lockHold // the admin lock, from Lock until its unlock
}

// Inventory returns the semaphore's inventory for the reconciler.
func (s *Semaphore) Inventory() *Inventory { return &Inventory{s: s} }

// Lock takes the semaphore's admin lock (a KV record renewed while held,
// taken over 15 s after its holder stops renewing it), which Resize takes to
// change the permit count, so a census reads one configuration throughout.
// Issue is guarded besides by a compare-and-set of the slot record. A
// semaphore being deleted (a Delete cut short holds no lock) is not
// repaired: tokensem.ErrNotInitialized.
func (inv *Inventory) Lock(ctx context.Context) (func(), error) {
	h, err := inv.s.takeLock(ctx)
	if err != nil {
		return nil, err
	}
	if cfg, _, err := inv.s.readConfig(ctx); err != nil || cfg.State == stateDeleting {
		h.unlock()
		if err == nil {
			err = fmt.Errorf("%w: %s is being deleted (a Delete of it was cut short: run it again)", tokensem.ErrNotInitialized, inv.s.name)
		}
		return nil, err
	}
	inv.mu.Lock()
	inv.hold = h
	inv.mu.Unlock()
	return func() {
		inv.mu.Lock()
		inv.hold = nil
		inv.mu.Unlock()
		h.unlock()
	}, nil
}

// stillLocked returns an error if the admin lock this run took was taken
// over meanwhile (its renewals did not land for lockTTL): the run must
// change nothing more.
func (inv *Inventory) stillLocked() error {
	inv.mu.Lock()
	h := inv.hold
	inv.mu.Unlock()
	if h == nil {
		return nil
	}
	return h.held()
}

// Census reads the configuration, every token message and every slot
// record.
//
// A broker that does not answer for a while (an election) is retried
// until ctx ends.
func (inv *Inventory) Census(ctx context.Context) (c driver.Census, err error) {
	err = inv.s.retry(ctx, "census", func() error {
		c, err = inv.census(ctx)
		return err
	})
	return c, err
}

// census is one try of Census.
func (inv *Inventory) census(ctx context.Context) (driver.Census, error) {
	s := inv.s
	if s.isClosed() {
		return driver.Census{}, tokensem.ErrClosed
	}
	cfg, err := s.refreshConfig(ctx)
	if err != nil {
		return driver.Census{}, err
	}
	// Records before tokens: a slot issued after its record was read shows
	// up in the scan, and one issued before it moved the revision Issue will
	// compare against.
	slots, err := s.slots.readAll(ctx)
	if err != nil {
		return driver.Census{}, err
	}
	msgs, err := s.scanTokens(ctx)
	if err != nil {
		return driver.Census{}, err
	}
	now, err := s.serverNow(ctx)
	if err != nil {
		return driver.Census{}, err
	}
	live := func(idx int) (slotEntry, bool) {
		sl, ok := slots[idx]
		return sl, ok && idx < cfg.Permits && sl.heldIn(cfg, now)
	}
	c := driver.Census{Permits: cfg.Permits, Epoch: cfg.Epoch, Entries: make([]driver.Entry, 0, len(msgs))}
	for _, m := range msgs {
		e := driver.Classify(s.codec, s.name, cfg.Permits, cfg.Epoch, m.Data)
		e.Ref = strconv.FormatUint(m.Seq, 10)
		switch {
		case e.Valid:
			sl, held := live(e.Token.Index)
			e.Held = held && sl.rec.Seq == m.Seq
		case e.Reason == "retired" && e.Token.Epoch == cfg.Epoch:
			// A slot a shrink retired, still held: left to its holder.
			sl, ok := slots[e.Token.Index]
			e.Held = ok && sl.heldIn(cfg, now) && sl.rec.Seq == m.Seq
		}
		c.Entries = append(c.Entries, e)
	}
	withToken := make(map[int]bool)
	for _, e := range c.Entries {
		if e.Held {
			withToken[e.Token.Index] = true
		}
	}
	var tokenless []int
	for idx := range slots {
		if _, held := live(idx); held {
			c.HeldSlots = append(c.HeldSlots, idx)
			if !withToken[idx] {
				tokenless = append(tokenless, idx)
			}
		}
	}
	if len(tokenless) > 0 {
		// Nothing this package leaves for long: a claim names the token it
		// was delivered, and a takeover deletes the old copy only after its
		// record names the new one. Anyone who may write slot records or
		// ack tokens can make it (see docs/protocol-nats.md, "What a client can
		// do").
		slices.Sort(tokenless)
		c.Problems = append(c.Problems, fmt.Sprintf("slots %v are held by records naming no token in the stream "+
			"(the record was written by someone else, or someone else acked or deleted its holder's token): "+
			"a real holder keeps its permit, and once it releases the slot is missing and a reconcile issues it again; "+
			"a forged record holds the slot until it is no longer rewritten and falls a lease silent", clipInts(tokenless)))
	}
	inv.mu.Lock()
	inv.slots, inv.now, inv.cfg = slots, now, cfg
	inv.mu.Unlock()
	return c, nil
}

// Remove deletes one token message by its stream sequence.
func (inv *Inventory) Remove(ctx context.Context, e driver.Entry) error {
	seq, err := strconv.ParseUint(e.Ref, 10, 64)
	if err != nil {
		return fmt.Errorf("natssem: bad message reference %q", e.Ref)
	}
	if err := inv.stillLocked(); err != nil {
		return err
	}
	return inv.s.deleteMsg(ctx, seq)
}

// Issue publishes a new token for index, at most once per state of the
// slot: the message ID names the slot record's revision as the latest
// Census saw it, so reconcilers that saw the same state publish one message
// between them (JetStream drops the second within its 2-minute duplicate
// window), and the compare-and-set that follows moves the revision, so that
// a later loss gets a fresh ID. A duplicate publish or a failed
// compare-and-set returns driver.ErrConflict.
func (inv *Inventory) Issue(ctx context.Context, index int) error {
	inv.mu.Lock()
	sl, cfg := inv.slots[index], inv.cfg
	inv.mu.Unlock()
	s := inv.s
	if cfg.Permits == 0 {
		return errors.New("natssem: Issue before Census")
	}
	if index < 0 || index >= cfg.Permits {
		return fmt.Errorf("natssem: slot %d outside [0, %d)", index, cfg.Permits)
	}
	if err := inv.stillLocked(); err != nil {
		return err
	}
	tok := driver.NewToken(s.name, index, cfg.Epoch)
	b, err := s.codec.Encode(tok)
	if err != nil {
		return err
	}
	id := s.lay.msgID(s.name, cfg.Epoch, fmt.Sprintf("reissue.%d.%d.%d", cfg.Epoch, index, sl.rev))
	rctx, cancel := s.rtt(ctx)
	ack, err := s.js.Publish(rctx, s.lay.subject, b, jetstream.WithMsgID(id))
	cancel()
	switch {
	case isAPIError(err, jsDuplicateInProcess):
		return driver.ErrConflict // another reconciler is issuing it
	case err != nil:
		return wrapBrokerErr(err)
	case ack.Duplicate:
		return driver.ErrConflict
	}
	if _, err := s.slots.cas(ctx, index, record{Epoch: cfg.Epoch, By: "reconciler", Token: tok.ID}, sl.rev, 0); err != nil {
		if errors.Is(err, errConflict) {
			return driver.ErrConflict
		}
		return err
	}
	s.log.Info("issued a token for a missing slot", "index", index)
	return nil
}

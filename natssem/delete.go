package natssem

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/driver"
	"github.com/tokensem/tokensem/internal/backoff"
	"github.com/tokensem/tokensem/internal/ids"
	"github.com/tokensem/tokensem/internal/weighted"
)

// Deleting a semaphore must neither strand a holder that does not know it
// lost its permit, nor mix with an Init of the same name on another client:
//  1. Delete takes the admin lock, so no reconcile, resize or other Delete
//     runs meanwhile;
//  2. it marks the configuration stateDeleting: Open refuses it, and Init
//     waits for the delete to end by taking the lock itself (and finishes
//     the delete of a deleter that died, once its lock expires);
//  3. it refuses (tokensem.ErrHeld) if a live holder holds a slot, putting
//     the configuration back; otherwise it closes every slot record by
//     compare-and-set (record.Deleted), so that no claim can win any more:
//     the slots of the configuration, of every record and of every token
//     in the stream (a client whose configuration predates a shrink may
//     claim above the permit count). A claim that won first moved the
//     record's revision, and the slot is looked at again. ForceDelete
//     closes held slots too (their holders' renewals fail: they lose their
//     permits) and waits a lease from the close by the server's clock, so
//     that nobody who held a permit of the old semaphore can still act on
//     it once an Init makes a new one. A closed record keeps its holder's
//     name, so a delete that resumes one cut short waits for (or, without
//     force, refuses on) the same holders;
//  4. it deletes the token stream, then the bucket. A key of a group
//     (WithGroup) has its consumer deleted, its tokens deleted, and its
//     records (configuration among them) purged from the group's bucket.
// A failure before step 4 puts the semaphore back (reopen): its records
// reopen still naming their holders, who keep their slots until a lease
// of silence. A holder therefore either makes Delete refuse, or never got
// its permit, or (ForceDelete) has learned of its loss before any new
// semaphore of the name exists.

// Delete removes semaphore name: its token stream and its KV bucket
// (configuration and slot records). While any permit is held it returns an
// error wrapping tokensem.ErrHeld, naming the held slots, and changes
// nothing. Acquire calls waiting meanwhile wait on, and return
// tokensem.ErrNotInitialized once the semaphore is gone; an Init of the
// same name waits for the delete and then creates the semaphore afresh.
// Delete finishes a delete that was cut short. Clients of versions before
// Delete existed do not see its closed slots: do not delete a semaphore
// they use.
//
// The semaphore's gate (see AcquireN) goes with it, force-deleted: a
// gatherer holding it has nothing left to gather. A weighted caller whose
// first AcquireN races the delete may make the gate again after it; the
// next Init of the name uses it, the next Delete removes it.
//
// Of a key of a group, pass WithGroup; other options are ignored.
//
// A semaphore whose configuration is invalid (see docs/protocol-nats.md) is
// refused with an error wrapping tokensem.ErrInvalidRecord: Delete cannot
// tell its holders by it. ForceDelete removes it.
//
// Errors: tokensem.ErrInvalidName, tokensem.ErrInvalidOption,
// tokensem.ErrNotInitialized (nothing of that name exists),
// tokensem.ErrHeld, tokensem.ErrInvalidRecord, or a wrapped broker error.
func Delete(ctx context.Context, nc *nats.Conn, name string, opts ...Option) error {
	return deleteSemaphore(ctx, nc, name, false, opts)
}

// ForceDelete removes semaphore name as Delete does, held permits or not.
// Every holder learns of it at its next renewal (Done closes with an error
// wrapping tokensem.ErrLeaseLost), within a third of the lease, and
// ForceDelete returns only a lease after it closed their slots (by the
// server's clock): give it a context that outlasts the lease. If ctx ends
// first, the semaphore is put back and its holders keep their slots.
// Waiters in Acquire return tokensem.ErrNotInitialized. It removes a
// semaphore whose configuration is invalid too, taking the lease of its
// holders from the token consumer (see docs/protocol-nats.md).
func ForceDelete(ctx context.Context, nc *nats.Conn, name string, opts ...Option) error {
	return deleteSemaphore(ctx, nc, name, true, opts)
}

func deleteSemaphore(ctx context.Context, nc *nats.Conn, name string, force bool, opts []Option) error {
	o, err := newOptions(opts)
	if err != nil {
		return err
	}
	return weighted.DeleteWithGate(ctx, name, force, func(ctx context.Context, name string, force bool) error {
		return deleteNamed(ctx, nc, name, force, o)
	})
}

// deleteNamed is Delete (force false) or ForceDelete of a name already
// checked.
func deleteNamed(ctx context.Context, nc *nats.Conn, name string, force bool, o options) error {
	s, err := newSemaphore(nc, name, o)
	if err != nil {
		return err
	}
	return backoff.Removal(func(step func() error) error { return s.retry(ctx, "delete", step) },
		tokensem.ErrNotInitialized, func(removed *bool) error { return s.delete(ctx, force, removed) })
}

func (s *Semaphore) delete(ctx context.Context, force bool, removed *bool) error {
	rctx, cancel := s.rtt(ctx)
	kv, err := s.js.KeyValue(rctx, s.lay.bucket)
	cancel()
	switch {
	case errors.Is(err, jetstream.ErrBucketNotFound) && s.lay.grouped():
		return s.removeKey(ctx, true, func(context.Context) error { return nil })
	case errors.Is(err, jetstream.ErrBucketNotFound):
		// Nothing to check; a stream left by a creation cut short goes too.
		return s.deleteStream(ctx, true)
	case err != nil:
		return wrapBrokerErr(err)
	}
	s.setBucket(kv)
	if s.lay.grouped() {
		// A key of which nothing exists is not made to exist by the
		// lock record and placeholder a delete writes.
		if _, _, err := s.readConfig(ctx); errors.Is(err, tokensem.ErrNotInitialized) {
			if _, err := s.consumerInfo(ctx); errors.Is(err, tokensem.ErrNotInitialized) {
				return fmt.Errorf("%w: %s", tokensem.ErrNotInitialized, s.name)
			}
		}
	}
	h, err := s.takeLock(ctx)
	if err != nil {
		return err
	}
	defer h.unlock()
	return s.deleteLocked(ctx, h, force, removed)
}

// deleteLocked is delete under the admin lock h. A failure before the
// stream goes puts the semaphore back (reopen), so that a delete cut short
// does not leave it refusing every claim; a later delete starts over.
func (s *Semaphore) deleteLocked(ctx context.Context, h *lockHold, force bool, removed *bool) (err error) {
	cfg, err := s.markDeleting(ctx, h)
	anyLife := false
	switch {
	case errors.Is(err, tokensem.ErrInvalidRecord) && force:
		// Unreadable: nobody can open the semaphore or Init it (see
		// invalidConfig), so it needs no mark; its holders are told by
		// their records, as below, judged by the token consumer's lease.
		if cfg, err = s.invalidLife(ctx); err != nil {
			return err
		}
		anyLife = true
	case errors.Is(err, tokensem.ErrInvalidRecord):
		return fmt.Errorf("%w; Delete cannot tell its holders by it: use ForceDelete", err)
	case err != nil:
		return err
	}
	defer func() {
		// A delete whose lock was taken over leaves the semaphore to the
		// lock's new holder.
		if err != nil && !*removed && h.held() == nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if rerr := s.reopen(rctx, h); rerr != nil {
				s.log.Warn("a delete that failed could not put the semaphore back; run Delete again", "err", rerr)
				err = fmt.Errorf("%w (and putting it back failed: %w)", err, rerr)
			}
		}
	}()
	// Of a key of a group, the mark moves the group's generation on, also
	// when it was made already (by a deleter that may have died before its
	// bump): a deleted key may be made again with another count and lease,
	// and a client trusts a cached configuration by the generation only
	// while it says ready (config.vouchable), so every client that cached
	// this life's reads the configuration again until it finds the next
	// life's. Nothing is removed without the bump.
	if err := s.bumpGeneration(ctx); err != nil {
		return err
	}
	wait, err := s.closeSlots(ctx, cfg, force, anyLife, h.held)
	if err != nil {
		return err
	}
	if wait > 0 {
		s.log.Info("waiting for the leases of the force-deleted permits to run out", "for", wait)
		if err := backoff.Sleep(ctx, wait); err != nil {
			return err
		}
	}
	if err := h.confirm(ctx); err != nil {
		return err
	}
	*removed = true // from here on, what a later try does not find is gone
	if err := s.removeResources(ctx, h.confirm); err != nil {
		return err
	}
	h.abandon() // the lock record went with the bucket (or the key's records)
	s.log.Info("semaphore deleted")
	return nil
}

// removeResources is step 4: the token stream, then the bucket; of a key
// of a group, the key's share of them (removeKey). Each removal comes
// right after confirm (the admin lock's: see lock.go), which stops the
// delete if the lock was taken over.
func (s *Semaphore) removeResources(ctx context.Context, confirm func(context.Context) error) error {
	if s.lay.grouped() {
		return s.removeKey(ctx, false, confirm)
	}
	if err := s.deleteStream(ctx, false); err != nil {
		return err
	}
	if err := confirm(ctx); err != nil {
		return err
	}
	rctx, cancel := s.rtt(ctx)
	defer cancel()
	if err := s.js.DeleteKeyValue(rctx, s.lay.bucket); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
		return wrapBrokerErr(err)
	}
	return nil
}

// invalidLife stands in for the configuration of a semaphore whose own is
// invalid, for ForceDelete: no slot of its own (Permits 0: the slots that
// have a record or a token are closed), any life (closeSlots' anyLife), and
// the lease its holders keep, which Init gave the token consumer as its
// AckWait. Without a consumer no token can be delivered: nobody holds one,
// and closeSlots finds that out itself.
func (s *Semaphore) invalidLife(ctx context.Context) (config, error) {
	cfg := config{Lease: tokensem.MaxLease}
	info, err := s.consumerInfo(ctx)
	switch {
	case errors.Is(err, tokensem.ErrNotInitialized):
	case err != nil:
		return config{}, err
	default:
		cfg.Lease = min(max(info.Config.AckWait, tokensem.MinLease), tokensem.MaxLease)
	}
	s.log.Warn("force-deleting a semaphore whose configuration is invalid; holders are judged by the token consumer's lease", "lease", cfg.Lease)
	return cfg, nil
}

// markDeleting marks the configuration stateDeleting (noting the state it
// had in Was) and returns it. A bucket without a configuration (an Init
// that has not written it yet) gets a placeholder in that state, which
// holds the Init off.
func (s *Semaphore) markDeleting(ctx context.Context, h *lockHold) (config, error) {
	for {
		cfg, rev, err := h.readConfig(ctx)
		switch {
		case errors.Is(err, tokensem.ErrNotInitialized):
			cfg = config{Version: s.lay.configVersion(), Permits: 1, Lease: s.opts.Lease, Epoch: ids.Epoch(), Created: time.Now().UnixMilli()}
			rev = 0
		case err != nil:
			return config{}, err
		case cfg.State == stateDeleting:
			return cfg, nil // an earlier try, or a deleter that died
		default:
			cfg.Was = cfg.State
		}
		cfg.State, cfg.Deleting = stateDeleting, time.Now().UnixMilli()
		rctx, cancel := s.rtt(ctx)
		if rev == 0 {
			_, err = s.kv.Create(rctx, s.lay.key(configKey), cfg.encode())
		} else {
			_, err = s.kv.Update(rctx, s.lay.key(configKey), cfg.encode(), rev)
		}
		cancel()
		switch {
		case errors.Is(err, jetstream.ErrKeyRevisionMismatch), errors.Is(err, jetstream.ErrKeyExists):
			continue // written meanwhile (an Init): read again
		case err != nil:
			return config{}, wrapBrokerErr(err)
		}
		return cfg, nil
	}
}

// closeSlots closes every slot record (see the top of this file) and
// returns how long the leases of live holders' records still run by the
// server's clock. A closed record keeps its holder: while it is a lease
// old or less it counts as live, so a delete that resumes a ForceDelete
// cut short waits for the same holders (or, without force, refuses), and
// a reopened slot is taken over only after a lease of silence. Without
// force a live holder makes it return an error wrapping tokensem.ErrHeld,
// having closed nothing if the holder was there from the start.
//
// The slots closed are those of the configuration, of every record, and of
// every token in the stream (a client whose cached configuration predates
// a shrink may still claim a slot above the permit count), and no other:
// a slot with neither a record nor a token cannot be claimed. With
// anyLife (the configuration is invalid: invalidLife), a record of any
// life counts as one of cfg's.
func (s *Semaphore) closeSlots(ctx context.Context, cfg config, force, anyLife bool, locked func() error) (time.Duration, error) {
	slots, err := s.slots.readAll(ctx)
	if err != nil {
		return 0, err
	}
	now, err := s.serverNow(ctx)
	if errors.Is(err, tokensem.ErrNotInitialized) {
		return 0, nil // no stream or consumer: no token can be delivered, nobody holds one
	}
	if err != nil {
		return 0, err
	}
	ofLife := func(sl slotEntry) bool { return anyLife || sl.ofLife(cfg.Epoch) }
	heldIn := func(sl slotEntry) bool { return ofLife(sl) && sl.live(now, cfg.Lease) }
	var held []int
	for idx, sl := range slots {
		if heldIn(sl) {
			held = append(held, idx)
		}
	}
	if len(held) > 0 && !force {
		slices.Sort(held)
		return 0, heldError(s.name, held, cfg.Lease)
	}
	msgs, err := s.scanTokens(ctx)
	if err != nil {
		return 0, err
	}
	toClose := make(map[int]bool, cfg.Permits+len(slots))
	for idx := range cfg.Permits {
		toClose[idx] = true
	}
	for idx := range slots {
		toClose[idx] = true
	}
	for _, m := range msgs {
		// Any token of this semaphore, whatever its life or signature
		// (Decode without a key checks none): its slot may be claimed.
		if tok, err := (driver.Codec{}).Decode(m.Data); err == nil && tok.Semaphore == s.name {
			toClose[tok.Index] = true // below tokensem.MaxPermits
		}
	}
	var until time.Time // when the last lease of a live holder's record runs out
	for _, idx := range slices.Sorted(maps.Keys(toClose)) {
		sl := slots[idx] // zero: never written, revision 0
		for {
			if err := locked(); err != nil {
				return 0, err // the admin lock's held (lock.go)
			}
			if heldIn(sl) {
				if !force {
					return 0, heldError(s.name, []int{idx}, cfg.Lease)
				}
				until = later(until, sl.written.Add(cfg.Lease))
			}
			if sl.rec.Deleted && ofLife(sl) {
				break
			}
			closed := sl.rec
			switch {
			case anyLife:
				// Kept in its own life: its holder, if any, finds its
				// record closed.
			case !sl.ofLife(cfg.Epoch):
				// A leftover of another life binds nobody; closed, it is
				// this life's (a claim of this life passes over a record
				// of another: see claim.go, lifeChecked).
				closed = record{Epoch: cfg.Epoch}
			default:
				closed.Epoch = cfg.Epoch
			}
			closed.Deleted = true
			newRev, err := s.slots.cas(ctx, idx, closed, sl.rev, 0)
			if err == nil {
				if !closed.free() {
					// Live or not, the holder's record now dates from this
					// write: wait a lease from it.
					sl = slotEntry{rec: closed, rev: newRev, written: now}
					until = later(until, now.Add(cfg.Lease))
				}
				break
			}
			if !errors.Is(err, errConflict) {
				return 0, err
			}
			// A claim, renewal or release wrote first: look again.
			if sl, err = s.slots.read(ctx, idx); err != nil {
				return 0, err
			}
			if now, err = s.serverNow(ctx); err != nil {
				return 0, err
			}
		}
	}
	if until.After(now) {
		return until.Sub(now), nil
	}
	return 0, nil
}

func heldError(name string, held []int, lease time.Duration) error {
	return fmt.Errorf("%w: %s: slots %v are held (renewed within the last %v)", tokensem.ErrHeld, name, held, lease)
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// reopen undoes a refused or failed delete: it reopens the closed slot
// records (a record that names a holder stays its until a lease of
// silence), then puts the configuration's state back (a placeholder goes).
func (s *Semaphore) reopen(ctx context.Context, h *lockHold) error {
	slots, err := s.slots.readAll(ctx)
	if err != nil {
		return err
	}
	for idx, sl := range slots {
		if !sl.rec.Deleted {
			continue
		}
		open := sl.rec
		open.Deleted = false
		if _, err := s.slots.cas(ctx, idx, open, sl.rev, 0); err != nil && !errors.Is(err, errConflict) {
			return err
		}
	}
	for {
		cfg, rev, err := h.readConfig(ctx)
		switch {
		case errors.Is(err, tokensem.ErrNotInitialized), errors.Is(err, tokensem.ErrInvalidRecord):
			return nil // nothing was marked
		case err != nil:
			return err
		case cfg.State != stateDeleting:
			return nil
		}
		rctx, cancel := s.rtt(ctx)
		if cfg.Was == "" {
			err = s.kv.Delete(rctx, s.lay.key(configKey), jetstream.LastRevision(rev))
		} else {
			cfg.State, cfg.Was, cfg.Deleting = cfg.Was, "", 0
			_, err = s.kv.Update(rctx, s.lay.key(configKey), cfg.encode(), rev)
		}
		cancel()
		switch {
		case errors.Is(err, jetstream.ErrKeyRevisionMismatch), errors.Is(err, jetstream.ErrKeyExists):
			continue
		case err != nil:
			return wrapBrokerErr(err)
		}
		return nil
	}
}

// awaitDelete waits for a delete that marked the configuration to end (by
// taking the admin lock its deleter holds). If the configuration is still
// marked once the lock is ours, its deleter died: the delete is finished,
// or undone if a holder turns up. Init calls it, and then starts over.
func (s *Semaphore) awaitDelete(ctx context.Context) error {
	s.log.Info("the semaphore is being deleted; waiting for that to end")
	h, err := s.takeLock(ctx)
	if errors.Is(err, tokensem.ErrNotInitialized) {
		return nil // deleted
	}
	if err != nil {
		return err
	}
	defer h.unlock()
	cfg, _, err := h.readConfig(ctx)
	switch {
	case errors.Is(err, tokensem.ErrNotInitialized):
		return nil
	case err != nil:
		return err
	case cfg.State != stateDeleting:
		return nil // refused, and put back
	}
	removed := false
	err = s.deleteLocked(ctx, h, false, &removed)
	if errors.Is(err, tokensem.ErrHeld) || errors.Is(err, errLockLost) {
		return nil // refused and put back, or ended by another: start over
	}
	return err
}

// deleteStream deletes the token stream; a missing one is
// ErrNotInitialized when nothing else was found either.
func (s *Semaphore) deleteStream(ctx context.Context, onlyThis bool) error {
	rctx, cancel := s.rtt(ctx)
	defer cancel()
	err := s.js.DeleteStream(rctx, s.lay.stream)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		if onlyThis {
			return fmt.Errorf("%w: %s", tokensem.ErrNotInitialized, s.name)
		}
		return nil
	case err != nil:
		return wrapBrokerErr(err)
	}
	return nil
}

// removeKey removes a group's key: its consumer (no token of it can be
// delivered any more; waiting pulls end), the tokens on its subject (see
// clearTokens), then its records, the configuration among them, in one
// purge of the bucket's stream. With onlyThis, finding none of it is
// ErrNotInitialized. confirm runs before the purge (see removeResources).
func (s *Semaphore) removeKey(ctx context.Context, onlyThis bool, confirm func(context.Context) error) error {
	rctx, cancel := s.rtt(ctx)
	err := s.js.DeleteConsumer(rctx, s.lay.stream, s.lay.consumer)
	cancel()
	found := true
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		if onlyThis {
			return fmt.Errorf("%w: %s", tokensem.ErrNotInitialized, s.name)
		}
		return nil // nothing of the group is left
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		found = false
	case err != nil:
		return wrapBrokerErr(err)
	}
	if _, err := s.clearTokens(ctx); err != nil && !errors.Is(err, tokensem.ErrNotInitialized) {
		return err
	}
	// The bucket's stream has no consumers but watchers, so one purge of
	// the key's records is cheap there.
	if err := confirm(ctx); err != nil {
		return err
	}
	rctx, cancel = s.rtt(ctx)
	defer cancel()
	kvStream, err := s.js.Stream(rctx, s.lay.kvStream())
	if err == nil {
		err = kvStream.Purge(rctx, jetstream.WithPurgeSubject(s.lay.kvSubject(">")))
	}
	if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return wrapBrokerErr(err)
	}
	if !found && onlyThis {
		return fmt.Errorf("%w: %s", tokensem.ErrNotInitialized, s.name)
	}
	return nil
}

// errDeleted is the cause of the loss of a permit whose semaphore was
// deleted.
var errDeleted = errors.New("natssem: the semaphore was deleted")

// gone reports whether the semaphore's bucket no longer exists (it was
// deleted), as opposed to not answering. It asks by deadline at the
// latest: a holder must give its permit up at its deadline whatever gone
// learns.
func (s *Semaphore) gone(ctx context.Context, deadline time.Time) bool {
	rctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	rctx, cancel = context.WithTimeout(rctx, s.requestTimeout())
	defer cancel()
	if s.lay.grouped() {
		_, err := s.js.Consumer(rctx, s.lay.stream, s.lay.consumer)
		return errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound)
	}
	_, err := s.js.KeyValue(rctx, s.lay.bucket)
	return errors.Is(err, jetstream.ErrBucketNotFound)
}

// answered reports whether a failed request got an answer (a missing
// stream answers "no responders" at once), rather than timing out: only
// then is it worth asking whether the semaphore is gone.
func answered(err error) bool {
	return !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout) &&
		!errors.Is(err, context.Canceled)
}

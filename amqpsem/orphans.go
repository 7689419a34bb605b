package amqpsem

import (
	"context"
	"time"

	"github.com/tokensem/tokensem/reconciler"
)

// An orphan is a token checked out to a consumer that no longer exists:
// RabbitMQ 3.10 can keep one after losing a token queue's leader, until
// that leader restarts (see the package doc). Nobody can be given it and
// nobody holds its slot, so once every other token is held, waiters wait
// for ever. A caller of Acquire that has waited long enough looks for
// such slots and repairs them (WithOrphanRepair).

// orphanCheck paces the orphan checks of one call of Acquire.
type orphanCheck struct {
	every time.Duration // the interval before the next check; 0: off
	next  time.Time     // when the next check is due
}

func (s *Semaphore) newOrphanCheck() *orphanCheck {
	d := s.opts.orphanRepair
	if d == 0 {
		return &orphanCheck{}
	}
	return &orphanCheck{every: d, next: time.Now().Add(d)}
}

// done schedules the check after one that ran, at a doubled interval (up
// to eight times the first).
func (oc *orphanCheck) done(first time.Duration) {
	oc.every = min(2*oc.every, 8*first)
	oc.next = time.Now().Add(oc.every)
}

// repairOrphans looks up every slot's claim; if some slot has no holder,
// it runs a repair on a connection of its own: the census there proves a
// slot missing only when neither a ready token nor a claim names it, twice
// a second apart, and the repair issues it (a duplicate this makes of a
// token that was only on its way can never admit a second holder: the
// claim refuses it, and the next repair removes it). The connection is
// separate because the census takes ready tokens with basic.get, which
// RabbitMQ answers during a queue's election by closing the connection
// and every permit on it. One check of the Semaphore runs at a time, and
// none sooner than the interval after the last one.
func (s *Semaphore) repairOrphans(ctx context.Context) {
	if !s.orphanMu.TryLock() {
		return // another caller of this Semaphore is checking
	}
	defer s.orphanMu.Unlock()
	if time.Since(s.orphanAt) < s.opts.orphanRepair {
		return
	}
	defer func() { s.orphanAt = time.Now() }()
	permits := s.config().Permits
	all := make([]int, permits)
	for i := range all {
		all[i] = i
	}
	held, err := s.readClaims(ctx, all)
	if err != nil || len(held) == permits {
		if err != nil && ctx.Err() == nil {
			s.log.Debug("orphan check: reading the claims failed", "err", err)
		}
		return
	}
	c, err := s.c.sibling(ctx)
	if err != nil {
		s.log.Warn("orphan check: connecting for a repair failed", "err", err)
		return
	}
	defer c.Close()
	r := newSemaphoreWith(c, s.name, s.opts)
	defer r.Close()
	// The gate of weighted acquires has waiters of its own, which check it.
	rep, err := reconciler.RunWithoutGate(ctx, r.Inventory(), true)
	switch {
	case err != nil && ctx.Err() == nil:
		s.log.Warn("orphan check: the repair failed", "err", err)
	case rep.Issued > 0 || rep.Removed > 0:
		s.log.Warn("a waiter found slots without a holder or a token and repaired them",
			"missing", rep.Missing, "issued", rep.Issued, "duplicates", rep.Duplicates, "removed", rep.Removed)
	}
}

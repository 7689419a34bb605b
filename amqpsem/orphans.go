package amqpsem

import (
	"context"
	"time"

	"github.com/tokensem/tokensem/reconciler"
)

// An orphan is a token checked out to a consumer that no longer exists:
// RabbitMQ 3.10 can keep one after losing a token queue's leader, until
// that leader restarts (see docs/protocol-rabbitmq.md). Nobody can be given it and
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

// orphanCheckLimit bounds one orphan check, the repair's wait for the
// creation lock and its census retries included, on top of the repair's
// hold of the missing slots (config.holdWait).
const orphanCheckLimit = 30 * time.Second

// startOrphanCheck starts a check in a goroutine of the Semaphore's (Close
// stops it and waits for it), unless one is running or the last ended less
// than the interval ago. The caller does not wait for it: a token
// delivered meanwhile must be claimed at once.
func (s *Semaphore) startOrphanCheck() {
	s.orphanMu.Lock()
	defer s.orphanMu.Unlock()
	if s.orphanRun || time.Since(s.orphanAt) < s.opts.orphanRepair || !s.track() {
		return
	}
	s.orphanRun = true
	go func() {
		defer s.tasks.Done()
		ctx, cancel := context.WithTimeout(s.life, orphanCheckLimit+s.config().holdWait())
		defer cancel()
		s.repairOrphans(ctx)
		s.orphanMu.Lock()
		s.orphanRun, s.orphanAt = false, time.Now()
		s.orphanMu.Unlock()
	}()
}

// track counts a goroutine of the Semaphore's in tasks, which Close
// waits for; it returns false once Close has been called.
func (s *Semaphore) track() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.tasks.Add(1)
	return true
}

// repairOrphans looks up every slot's claim; if some slot has no holder,
// it runs a repair on a connection of its own: the census there proves a
// slot missing only when neither a ready token nor a claim names it, and
// the repair issues it only after holding the slot's claim for W (see
// Inventory.Issue). The copy it makes retires the slot's old token: if the
// orphan (or a token that was only on its way) returns, it is removed
// when next delivered, or by the next repair. The connection is
// separate because the census takes ready tokens with basic.get, which
// RabbitMQ answers during a queue's election by closing the connection
// and every permit on it; it is closed when ctx ends, which ends every
// call on it.
func (s *Semaphore) repairOrphans(ctx context.Context) {
	permits := s.config().Permits
	held, err := s.readClaims(ctx, allSlots(permits))
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
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer stop()
	r := newSemaphoreWith(c, s.name, s.opts)
	defer r.Close()
	// The gate of weighted acquires has waiters of its own, which check it.
	rep, err := reconciler.RunWithoutGate(ctx, r.Inventory(), true)
	switch {
	case err != nil && ctx.Err() == nil:
		s.log.Warn("orphan check: the repair failed", "err", err)
	case err != nil:
		s.log.Warn("orphan check: the repair did not finish in time", "limit", orphanCheckLimit, "err", err)
	case rep.Issued > 0 || rep.Removed > 0:
		s.log.Warn("a waiter found slots without a holder or a token and repaired them",
			"missing", rep.Missing, "issued", rep.Issued, "duplicates", rep.Duplicates, "removed", rep.Removed)
	}
}

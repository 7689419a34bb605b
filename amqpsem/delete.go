package amqpsem

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/driver"
	"github.com/tokensem/tokensem/internal/backoff"
	"github.com/tokensem/tokensem/internal/ctxerr"
	"github.com/tokensem/tokensem/internal/ids"
	"github.com/tokensem/tokensem/internal/weighted"
)

// Delete removes semaphore name, under its creation lock (no Init,
// reconcile or resize runs meanwhile). While any permit is held it returns
// an error wrapping tokensem.ErrHeld and changes nothing. To tell, it
// claims every slot itself as a holder would, so that no permit can be
// taken while it removes the queues: a holder either makes Delete refuse
// or never gets its permit (Acquire calls waiting meanwhile return
// tokensem.ErrNotInitialized once the semaphore is gone). Delete finishes
// a delete that was cut short, claim queues it left included; afterwards
// Init of the same name with other values succeeds. No signing key is
// needed. A holder of a slot that a shrink retired (index >= permits) is
// not seen by the check: Delete takes its permit as ForceDelete would.
//
// A holder whose connection stopped working may believe it holds for W
// (see WithHeartbeat) after the broker took its permit away. When the
// token queue shows anyone holding or waiting for a token (a quorum queue
// counts both; a classic one cannot tell), or a slot was held, Delete marks
// the configuration "deleting", removes the token and claim queues, waits
// W and a third (two heartbeats of the Conn that made the semaphore) with
// the lock held, and only then removes the configuration: a new life of
// the name cannot be claimed while a holder of the old one may still
// believe. If the deleter dies during that wait, the next Init or Delete
// of the name waits it out in full first.
//
// The semaphore's gate (see AcquireN) goes with it, force-deleted: a
// gatherer holding it has nothing left to gather. A weighted caller whose
// first AcquireN races the delete may make the gate again after it; the
// next Init of the name uses it, the next Delete removes it.
//
// A semaphore whose configuration is invalid (see docs/protocol-rabbitmq.md) is
// refused with an error wrapping tokensem.ErrInvalidRecord: Delete cannot
// tell its holders by it. ForceDelete removes it.
//
// Errors: tokensem.ErrInvalidName, tokensem.ErrNotInitialized (nothing of
// that name exists), tokensem.ErrHeld, tokensem.ErrInvalidRecord,
// ctx.Err(), or a wrapped broker error.
func Delete(ctx context.Context, c *Conn, name string) error {
	return deleteSemaphore(ctx, c, name, false)
}

// ForceDelete removes semaphore name as Delete does, held permits or not.
// The broker cancels every consumer of the deleted queues: holders lose
// their permits (Done closes with an error wrapping tokensem.ErrLeaseLost)
// and waiters in Acquire return tokensem.ErrNotInitialized. With a permit
// held it always waits as Delete describes, so it returns only once every
// holder has been told or has passed W. It removes a semaphore whose
// configuration is invalid too (see docs/protocol-rabbitmq.md), always waiting W and
// a third then.
func ForceDelete(ctx context.Context, c *Conn, name string) error {
	return deleteSemaphore(ctx, c, name, true)
}

func deleteSemaphore(ctx context.Context, c *Conn, name string, force bool) error {
	return weighted.DeleteWithGate(ctx, name, force, func(ctx context.Context, name string, force bool) error {
		return deleteNamed(ctx, c, name, force)
	})
}

// deleteNamed is Delete (force false) or ForceDelete of a name already
// checked.
func deleteNamed(ctx context.Context, c *Conn, name string, force bool) error {
	s, err := newSemaphore(c, name, c.logTo())
	if err != nil {
		return err
	}
	defer s.Close()
	err = backoff.Removal(func(step func() error) error { return s.retryLocking(ctx, "delete", step) },
		tokensem.ErrNotInitialized, func(removed *bool) error { return s.delete(ctx, force, removed) })
	return ctxerr.After(ctx, err)
}

func (s *Semaphore) delete(ctx context.Context, force bool, removed *bool) error {
	ctx, unlock, err := s.lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	cfg, err := s.loadConfig(ctx)
	switch {
	case errors.Is(err, tokensem.ErrNotInitialized):
		// No configuration: whatever is left of a creation or a delete
		// cut short goes.
		found, err := s.deleteQueues(ctx, 0)
		*removed = *removed || found
		if err != nil {
			return err
		}
		found, err = s.deleteLeftoverClaims(ctx)
		*removed = *removed || found
		if err != nil {
			return err
		}
		s.unregister(ctx)
		if !found {
			return fmt.Errorf("%w: %s", tokensem.ErrNotInitialized, s.name)
		}
		return nil
	case errors.Is(err, tokensem.ErrInvalidRecord) && force:
		*removed = true
		if cfg, err = s.markInvalidDeleting(ctx); err != nil {
			return err
		}
		if err := s.finishDelete(ctx, cfg); err != nil {
			return err
		}
		s.unregister(ctx)
		return nil
	case errors.Is(err, tokensem.ErrInvalidRecord):
		return fmt.Errorf("%w; Delete cannot tell its holders by it: use ForceDelete", err)
	case err != nil:
		return err
	case cfg.State == stateDeleting:
		*removed = true
		if err := s.finishDelete(ctx, cfg); err != nil {
			return err
		}
		s.unregister(ctx)
		return nil
	}
	s.setConfig(cfg)
	refuse := 0 // slots below refuse that are held make Delete refuse
	if !force {
		refuse = cfg.Permits
	}
	release, held, err := s.closeSlots(ctx, cfg.slots(), refuse)
	if err != nil {
		return err
	}
	defer release()
	believers := len(held) > 0
	if !believers {
		// None can come while the slots are claimed here: a moment with
		// no token out proves there is none.
		if believers, err = s.tokensOutFor(ctx, cfg, deleteLook); err != nil {
			return err
		}
	}
	*removed = true
	if believers {
		s.log.Info("deleting: a permit may be held; waiting for its holder before the configuration goes", "held", held, "wait", cfg.holdWait())
		cfg.State, cfg.Seq = stateDeleting, cfg.Seq+1
		if err := s.writeConfig(ctx, cfg); err != nil {
			return err
		}
		if err := s.finishDelete(ctx, cfg); err != nil {
			return err
		}
	} else if _, err := s.deleteQueues(ctx, cfg.slots()); err != nil {
		return err
	}
	s.log.Info("semaphore deleted")
	s.unregister(ctx)
	return nil
}

// finishDelete removes the queues of a semaphore whose configuration says
// "deleting": the token and claim queues, then, W and a third later, the
// configuration. The wait starts over: a deleter that wrote the mark may
// have died at any point of its own.
func (s *Semaphore) finishDelete(ctx context.Context, cfg config) error {
	if err := s.deleteQueue(ctx, tokenQueue(s.name)); err != nil {
		return err
	}
	if err := s.deleteClaims(ctx, cfg.slots()); err != nil {
		return err
	}
	if err := s.deleteExchange(ctx); err != nil {
		return err
	}
	if err := backoff.Sleep(ctx, cfg.holdWait()); err != nil {
		return err
	}
	// On the lock's connection (pinned), or not at all: the wait counts
	// only if no one else took the lock meanwhile.
	return s.deleteQueue(ctx, configQueue(s.name))
}

// markInvalidDeleting replaces an invalid configuration (ForceDelete) with
// one that says "deleting", so that finishDelete removes the semaphore as
// it removes any other, and a deleter that dies during its wait leaves a
// mark the next Init or Delete waits out. Its slots are those that have a
// claim queue or a ready token (claimSlotsFound), and no more; its W is
// the longer of this Conn's and DefaultHeartbeat's bound, since the stored
// one cannot be read.
func (s *Semaphore) markInvalidDeleting(ctx context.Context) (config, error) {
	slots, err := s.claimSlotsFound(ctx)
	if err != nil {
		return config{}, err
	}
	bound := max(s.c.holdBound(), holdBoundOf(DefaultHeartbeat))
	cfg := config{Version: configVersion, Seq: 1, State: stateDeleting, Permits: max(slots, 1), Issued: slots,
		Epoch: ids.Epoch(), QueueType: Quorum, Created: time.Now().UnixMilli(), HoldBoundMS: bound.Milliseconds()}
	s.log.Warn("force-deleting a semaphore whose configuration is invalid", "slots", slots, "wait", cfg.holdWait())
	if err := s.replaceConfig(ctx, cfg); err != nil {
		return config{}, err
	}
	return cfg, nil
}

// claimGap is how many missing claim queues in a row claimSlotsFound
// passes over before it takes the rest to be missing too.
const claimGap = 64

// claimSlotsFound returns one more than the highest slot that has a claim
// queue or a ready token, for a semaphore whose configuration cannot say
// how many slots it has: the claim queues, which Init declares for slots
// from 0 up, are looked for until claimGap in a row are missing (they go
// together with the node that held them), and the ready tokens are read
// and put back.
func (s *Semaphore) claimSlotsFound(ctx context.Context) (int, error) {
	slots, err := s.readyTokenSlots(ctx)
	if err != nil {
		return 0, err
	}
	for i, missing := 0, 0; missing < claimGap && i < tokensem.MaxPermits; i++ {
		_, exists, err := s.queueInfo(ctx, claimQueue(s.name, i))
		switch {
		case isCode(err, amqp.ResourceLocked): // a quarantine holds it: it exists
		case err != nil:
			return 0, err
		case !exists:
			missing++
			continue
		}
		missing, slots = 0, max(slots, i+1)
	}
	return slots, nil
}

// readyTokenSlots reads the ready tokens of the token queue and puts them
// back (as a census does), and returns one more than the highest slot a
// token of this semaphore names (of any life, signed or not), or 0.
func (s *Semaphore) readyTokenSlots(ctx context.Context) (int, error) {
	bodies, _, err := s.readReady(ctx)
	if errors.Is(err, tokensem.ErrNotInitialized) {
		return 0, nil // no token queue
	}
	if err != nil {
		return 0, err
	}
	slots := 0
	for _, b := range bodies {
		if tok, err := (driver.Codec{}).Decode(b); err == nil && tok.Semaphore == s.name {
			slots = max(slots, tok.Index+1) // below tokensem.MaxPermits
		}
	}
	return slots, nil
}

// tokensOut reports whether anyone may hold a token: a quorum token queue
// counts as a consumer everyone holding one of its messages unacked, a
// waiter, an orphan (measured on 3.10.8, see Status), and a holder whose
// claim the broker cancelled; a classic one counts only waiters.
//
// No consumer counts only with a token ready: RabbitMQ answers a count it
// could not take (the queue's leader lost, or busy for 250 ms) with 0
// ready and 0 consumers (rabbit_quorum_queue:stat, 3.10 to 4.3). Trusting
// that answer while a token queue's leader was being replaced let a repair
// issue a slot's token while its holder, cut off from the broker, still
// believed it held it (TestClusterStalledHolderNodeLoss, beside CPU load).
func (s *Semaphore) tokensOut(ctx context.Context, cfg config) (bool, error) {
	if cfg.QueueType != Quorum {
		return true, nil
	}
	q, exists, err := s.queueInfo(ctx, tokenQueue(s.name))
	return !exists || q.Consumers > 0 || q.Messages == 0, err
}

// tokensOutFor looks at the token queue for up to d, and reports whether
// tokens were out (see tokensOut) every time it looked.
func (s *Semaphore) tokensOutFor(ctx context.Context, cfg config, d time.Duration) (bool, error) {
	for end := time.Now().Add(d); ; {
		out, err := s.tokensOut(ctx, cfg)
		if err != nil || !out || cfg.QueueType != Quorum || time.Now().After(end) {
			return out, err
		}
		if err := backoff.Sleep(ctx, tokensOutPoll); err != nil {
			return true, err
		}
	}
}

// deleteLook is how long a delete looks for a moment with no token out,
// before it takes the slow way (see Delete).
const deleteLook = 250 * time.Millisecond

// slots returns how many slots may have a claim queue: every slot that
// had a token in this life.
func (c config) slots() int {
	if c.Issued > c.Permits {
		return c.Issued
	}
	return c.Permits
}

// closeSlots claims slots [0, slots) as a holder would (an exclusive
// consumer on its claim queue), so that no claim can succeed while Delete
// removes the queues: a claimer that got a token is refused and gives it
// back. A slot claimed already is held: below refuse that is
// tokensem.ErrHeld, and nothing is kept; above, the slot is returned in
// held. release drops the claims (the queues' deletion drops them too).
func (s *Semaphore) closeSlots(ctx context.Context, slots, refuse int) (release func(), held []int, err error) {
	ch, _, err := s.c.channel(ctx)
	if err != nil {
		return nil, nil, err
	}
	chans := []*channel{ch} // every channel opened, for release
	release = func() {
		for _, ch := range chans {
			_ = ch.Close()
		}
	}
	for i := range slots {
		if ch.IsClosed() { // a held slot's 403 closed it
			next, _, err := s.c.channel(ctx)
			if err != nil {
				release()
				return nil, nil, err
			}
			ch = next
			chans = append(chans, ch)
		}
		q := claimQueue(s.name, i)
		rctx, cancel := s.rtt(ctx)
		err := s.c.rpc(rctx, ch, func() error {
			if _, err := ch.QueueDeclare(q, false, false, false, false, nil); err != nil {
				return err
			}
			if err := rctx.Err(); err != nil {
				return err // abandoned: claim nothing more
			}
			_, err := ch.Consume(q, "tokensem-delete-"+strconv.Itoa(i), false, true, false, false, nil)
			return err
		}, nil)
		cancel()
		switch {
		case (isCode(err, amqp.AccessRefused) || isCode(err, amqp.ResourceLocked)) && i < refuse:
			release()
			return nil, nil, fmt.Errorf("%w: %s: slot %d is held", tokensem.ErrHeld, s.name, i)
		case isCode(err, amqp.AccessRefused) || isCode(err, amqp.ResourceLocked):
			held = append(held, i)
		case err != nil:
			release()
			return nil, nil, wrapBrokerErr("claim slot "+strconv.Itoa(i)+" to delete it", err)
		}
	}
	return release, held, nil
}

// deleteQueues deletes the semaphore's queues, configuration first, and
// the claim queues of slots [0, slots) (see deleteClaims); found says the
// configuration or token queue existed. A claim queue of a slot retired
// by a shrink that nobody held since is not known here: it is not
// durable, and goes with its node's next restart.
func (s *Semaphore) deleteQueues(ctx context.Context, slots int) (found bool, err error) {
	for _, q := range []string{configQueue(s.name), tokenQueue(s.name)} {
		exists, err := s.queueExists(ctx, q)
		if err != nil {
			return found, err
		}
		if !exists {
			continue
		}
		found = true
		if err := s.deleteQueue(ctx, q); err != nil {
			return found, err
		}
	}
	if err := s.deleteClaims(ctx, slots); err != nil {
		return found, err
	}
	return found, s.deleteExchange(ctx)
}

// deleteClaims deletes the claim queues of slots [0, slots), the highest
// first: what a delete cut short leaves of them is slots [0, k), which
// the next try finds without the configuration (see leftoverClaims).
func (s *Semaphore) deleteClaims(ctx context.Context, slots int) error {
	for i := slots - 1; i >= 0; i-- {
		if err := s.deleteQueue(ctx, claimQueue(s.name, i)); err != nil {
			return err
		}
	}
	return nil
}

// deleteLeftoverClaims removes the claim queues a delete cut short left
// behind its configuration and token queue, which are gone (a delete
// removes them first): found says there were some. Each is claimed first,
// as Delete claims a slot. One claimed already belongs to a holder that
// got the slot's token after the cut and lost it with the token queue; it
// may still believe it holds (for W, its link stalled), and its claim
// keeps it out of the name's next life meanwhile, so the claims go only
// after W and a third (the longest of this Conn's, DefaultHeartbeat's and
// a configuration an earlier try read, since the stored one is gone).
func (s *Semaphore) deleteLeftoverClaims(ctx context.Context) (found bool, err error) {
	slots, err := s.leftoverClaims(ctx)
	if err != nil || slots == 0 {
		return false, err
	}
	release, held, err := s.closeSlots(ctx, slots, 0)
	if err != nil {
		return true, err
	}
	defer release()
	if len(held) > 0 {
		seen := s.config() // zero unless an earlier try read one
		wait := config{HoldBoundMS: max(seen.holdBound(), s.c.holdBound(), holdBoundOf(DefaultHeartbeat)).Milliseconds()}.holdWait()
		s.log.Info("deleting claim queues left by a delete cut short: a slot is held; waiting for its holder", "held", held, "wait", wait)
		if err := backoff.Sleep(ctx, wait); err != nil {
			return true, err
		}
	}
	return true, s.deleteClaims(ctx, slots)
}

// leftoverClaims returns how many claim queues, from slot 0 up, exist
// (one under quarantine counts): one passive declare when there is none.
// A gap (a claim queue gone with its node) hides the rest, which go with
// their nodes' next restarts.
func (s *Semaphore) leftoverClaims(ctx context.Context) (int, error) {
	for i := 0; i < tokensem.MaxPermits; i++ {
		exists, err := s.queueExists(ctx, claimQueue(s.name, i))
		switch {
		case isCode(err, amqp.ResourceLocked): // a quarantine holds it: it exists
		case err != nil:
			return 0, err
		case !exists:
			return i, nil
		}
	}
	return tokensem.MaxPermits, nil
}

// deleteExchange deletes the semaphore's exchange (see bind); one that
// does not exist is deleted already.
func (s *Semaphore) deleteExchange(ctx context.Context) error {
	x := exchangeName(s.name)
	return s.deleteOne(ctx, "delete exchange "+x, func(ch *channel) error { return ch.ExchangeDelete(x, false, false) })
}

// deleteQueue deletes queue q; a queue that does not exist is deleted
// already.
func (s *Semaphore) deleteQueue(ctx context.Context, q string) error {
	return s.deleteOne(ctx, "delete queue "+q, func(ch *channel) error {
		_, err := ch.QueueDelete(q, false, false, false)
		return err
	})
}

// deleteOne runs the delete del on a channel of its own, as one rpc; a
// resource that does not exist (404) is deleted already.
func (s *Semaphore) deleteOne(ctx context.Context, what string, del func(*channel) error) error {
	ch, _, err := s.c.channel(ctx)
	if err != nil {
		return err
	}
	defer ch.Close()
	rctx, cancel := s.rtt(ctx)
	defer cancel()
	err = s.c.rpc(rctx, ch, func() error { return del(ch) }, nil)
	if err != nil && !isCode(err, amqp.NotFound) {
		return wrapBrokerErr(what, err)
	}
	return nil
}

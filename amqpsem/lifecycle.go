package amqpsem

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/backoff"
	"github.com/tokensem/tokensem/internal/weighted"
)

// errDeleted is the cause of the loss of a permit whose semaphore was
// deleted.
var errDeleted = errors.New("amqpsem: the semaphore was deleted")

// Delete removes semaphore name, under its creation lock (no Init,
// reconcile or resize runs meanwhile): its configuration queue first, so
// that nobody can open it any more, then its token queue, its slots' claim
// queues and the configuration queue of an older layout. While any permit
// is held it returns an error wrapping tokensem.ErrHeld and changes
// nothing. To tell, it claims every slot itself as a holder would, so that
// no permit can be taken while it removes the queues: a holder either
// makes Delete refuse or never gets its permit (Acquire calls waiting
// meanwhile return tokensem.ErrNotInitialized once the semaphore is gone).
// Delete finishes a delete that was cut short; afterwards Init of the same
// name with other values succeeds. No signing key is needed. A holder of a
// slot that a shrink retired (index >= permits) is not seen by the check:
// Delete takes its permit as ForceDelete would.
//
// The semaphore's gate (see AcquireN) goes with it, force-deleted: a
// gatherer holding it has nothing left to gather. A weighted caller whose
// first AcquireN races the delete may make the gate again after it; the
// next Init of the name uses it, the next Delete removes it.
//
// Errors: tokensem.ErrInvalidName, tokensem.ErrNotInitialized (nothing of
// that name exists), tokensem.ErrHeld, or a wrapped broker error.
func Delete(ctx context.Context, c *Conn, name string) error {
	return deleteSemaphore(ctx, c, name, false)
}

// ForceDelete removes semaphore name as Delete does, held permits or not.
// The broker cancels every consumer of the deleted queues: holders lose
// their permits (Done closes with an error wrapping tokensem.ErrLeaseLost)
// and waiters in Acquire return tokensem.ErrNotInitialized.
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
	s, err := newSemaphore(c, name, nil)
	if err != nil {
		return err
	}
	defer s.Close()
	return backoff.Removal(func(step func() error) error { return s.retry(ctx, "delete", step) },
		tokensem.ErrNotInitialized, func(removed *bool) error { return s.delete(ctx, force, removed) })
}

func (s *Semaphore) delete(ctx context.Context, force bool, removed *bool) error {
	unlock, err := s.lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	cfg, err := s.loadConfig(ctx)
	switch {
	case errors.Is(err, tokensem.ErrNotInitialized), errors.Is(err, errLegacyLayout):
		// No current configuration: whatever is left of a creation or a
		// delete cut short, or an older layout, goes.
		found, err := s.deleteQueues(ctx, 0)
		*removed = *removed || found
		if err != nil {
			return err
		}
		if err := s.unregister(ctx); err != nil {
			return err
		}
		if !found {
			return fmt.Errorf("%w: %s", tokensem.ErrNotInitialized, s.name)
		}
		return nil
	case err != nil:
		return err
	}
	s.setConfig(cfg)
	if !force {
		release, err := s.closeSlots(ctx, cfg.Permits)
		if err != nil {
			return err
		}
		defer release()
	}
	*removed = true
	if _, err := s.deleteQueues(ctx, cfg.Permits); err != nil {
		return err
	}
	s.log.Info("semaphore deleted")
	return s.unregister(ctx)
}

// closeSlots claims every slot as a holder would (an exclusive consumer on
// its claim queue), so that no claim can succeed while Delete removes the
// queues: a claimer that got a token is refused and gives it back. A slot
// claimed already is held: tokensem.ErrHeld, and nothing is kept. release
// drops the claims (the queues' deletion drops them too).
func (s *Semaphore) closeSlots(ctx context.Context, permits int) (release func(), err error) {
	ch, _, err := s.c.channel(ctx)
	if err != nil {
		return nil, err
	}
	release = func() { _ = ch.Close() }
	for i := range permits {
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
		case isCode(err, amqp.AccessRefused):
			release()
			return nil, fmt.Errorf("%w: %s: slot %d is held", tokensem.ErrHeld, s.name, i)
		case err != nil:
			release()
			return nil, wrapBrokerErr("claim slot "+strconv.Itoa(i)+" to delete it", err)
		}
	}
	return release, nil
}

// deleteQueues deletes the semaphore's queues, configuration first, and
// the claim queues of slots [0, permits); found says any of them existed.
// A claim queue of a slot retired by a shrink that nobody held since is
// not known here: it is not durable, and goes with its node's next
// restart.
func (s *Semaphore) deleteQueues(ctx context.Context, permits int) (found bool, err error) {
	queues := []string{configQueue(s.name), QueueName(s.name), legacyConfigQueue(s.name)}
	for i := range permits {
		queues = append(queues, claimQueue(s.name, i))
	}
	for i, q := range queues {
		if i < 3 {
			exists, err := s.queueExists(ctx, q)
			if err != nil {
				return found, err
			}
			if !exists {
				continue
			}
			found = true
		}
		if err := s.deleteQueue(ctx, q); err != nil {
			return found, err
		}
	}
	return found, nil
}

// deleteQueue deletes queue q; a queue that does not exist is deleted
// already.
func (s *Semaphore) deleteQueue(ctx context.Context, q string) error {
	ch, _, err := s.c.channel(ctx)
	if err != nil {
		return err
	}
	defer ch.Close()
	rctx, cancel := s.rtt(ctx)
	defer cancel()
	err = s.c.rpc(rctx, ch, func() error {
		_, err := ch.QueueDelete(q, false, false, false)
		return err
	}, nil)
	if err != nil && !isCode(err, amqp.NotFound) {
		return wrapBrokerErr("delete queue "+q, err)
	}
	return nil
}

package amqpsem

import (
	"context"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem/internal/backoff"
)

// lock takes the semaphore's creation lock (see takeLock): the locked
// work runs with the returned context.
func (s *Semaphore) lock(ctx context.Context) (context.Context, func(), error) {
	return s.takeLock(ctx, lockQueue(s.name), "another Init, reconcile or delete of "+s.name)
}

// takeLock takes a broker-wide lock: the exclusive queue q, which a
// second connection cannot declare (405 RESOURCE_LOCKED) and which the
// broker deletes if the holder's connection dies. A mutex per q keeps the
// callers sharing this process's connection (to which the exclusive queue
// belongs) out of each other's way. It waits, until ctx ends, while
// someone else (holder, for messages) has the lock.
//
// The lock lives with the connection that declared it, while the Conn
// reconnects behind its callers' backs: the returned context pins the
// locked work to that connection (see pin). Every channel the work opens
// with it is opened there, and once that connection is lost, the work
// fails with errLockLost instead of going on, unlocked, on the next one.
func (s *Semaphore) takeLock(ctx context.Context, q, holder string) (context.Context, func(), error) {
	local := s.c.localLock(q)
	if !tryLock(ctx, local) {
		return nil, nil, fmt.Errorf("amqpsem: waiting for %s: %w", holder, ctx.Err())
	}
	pause := backoff.Backoff{Min: 20 * time.Millisecond, Max: 200 * time.Millisecond}
	for {
		ch, sess, err := s.c.channel(ctx)
		if err != nil {
			local.Unlock()
			return nil, nil, err
		}
		rctx, cancel := s.rtt(ctx)
		err = s.c.rpc(rctx, ch, func() error {
			_, err := ch.QueueDeclare(q, false, false, true, false, nil)
			return err
		}, func() {
			// The caller gave up before the broker answered: if the
			// declare landed, the lock is this connection's with nobody to
			// free it, and other connections would wait for it as long as
			// this one lives. (A delete of a queue another connection holds
			// exclusively is refused, and deletes nothing.)
			_, _ = ch.QueueDelete(q, false, false, false)
			local.Unlock()
		})
		cancel()
		if err == nil {
			return pin(ctx, sess), func() { s.releaseLock(ch, q, local) }, nil
		}
		if ch.abandoned.Load() {
			// The undo above frees the queue and then local.
			if cerr := ctx.Err(); cerr != nil {
				return nil, nil, cerr
			}
			return nil, nil, wrapBrokerErr("taking the lock "+q, err)
		}
		_ = ch.Close()
		switch {
		case isCode(err, amqp.ResourceLocked):
		case isCode(err, amqp.InternalError):
			// Declaring an exclusive queue while its previous owner's
			// delete of it is still going on fails with 541 and closes the
			// connection (seen on 3.10.8 with semgroup's idle expiry
			// deleting a semaphore another replica creates again); the
			// connection is made again and the declare retried, after a
			// pause long enough for the delete to end (every 541 costs the
			// permits held on this connection).
			s.log.Warn("the lock queue was being deleted as it was declared (541; the connection was closed); retrying", "queue", q)
			if err := backoff.Sleep(ctx, 500*time.Millisecond); err != nil {
				local.Unlock()
				return nil, nil, fmt.Errorf("amqpsem: waiting for %s: %w", holder, err)
			}
		case isConnectionLost(err) && pinnedSession(ctx) == nil:
			// The connection closed under the declare (another call on it
			// got a 541, say): the Conn makes it again; declare again.
			s.log.Warn("the connection closed while declaring the lock queue; retrying", "queue", q, "err", err)
		default:
			local.Unlock()
			return nil, nil, wrapBrokerErr("taking the lock "+q, err)
		}
		if err := pause.Wait(ctx, nil); err != nil {
			local.Unlock()
			return nil, nil, fmt.Errorf("amqpsem: waiting for %s: %w", holder, err)
		}
	}
}

// releaseLock deletes the lock queue q, waiting for the broker at most a
// request timeout: a broker that does not answer the delete (seen from the
// bench harness on a RabbitMQ with 2,500 queues, an Init stuck for 18
// minutes) must not hold the caller for ever. A delete left unanswered
// finishes, or the queue goes with the connection (it is exclusive); until
// then other connections wait for the lock, this one does not.
func (s *Semaphore) releaseLock(ch *channel, q string, local *sync.Mutex) {
	defer local.Unlock()
	rctx, cancel := s.rtt(context.Background())
	defer cancel()
	err := s.c.rpc(rctx, ch, func() error {
		_, err := ch.QueueDelete(q, false, false, false)
		return err
	}, nil)
	if err != nil {
		s.log.Warn("could not delete the lock queue; it goes when the broker answers or the connection closes", "queue", q, "err", err)
	}
	_ = ch.Close() // an abandoned channel is closed once the delete returns
}

// tryLock locks m unless ctx ends first.
func tryLock(ctx context.Context, m *sync.Mutex) bool {
	for !m.TryLock() {
		if backoff.Sleep(ctx, 5*time.Millisecond) != nil {
			return false
		}
	}
	return true
}

package amqpsem

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/driver"
)

// A slot is claimed by an exclusive consumer on its claim queue
// (claimQueue): the broker refuses a second exclusive consumer while the
// first exists and drops it when its channel or connection closes. reserve
// keeps two callers of this process from trying for one slot at once.
//
// Init declares every slot's claim queue before the first token exists (a
// grown semaphore's new slots get theirs before their tokens), so a claim
// queue that is missing went away: it is not durable and lives on one
// node, so it goes when that node restarts or is lost, and the broker
// cancels the claim of its holder. That holder may be cut off from the
// broker (its link stalled) and believe it holds for W (see Conn.holdBound)
// yet, and its token may be back in the queue (RabbitMQ returns the tokens
// of consumers on a lost node). So a token that was delivered before may
// claim its slot through a missing claim queue only after a quarantine:
// the claim queue is declared exclusive to one connection (every other
// connection is refused, 405) and held for W and a third
// (config.holdWait), and only then made again as every holder uses it. A
// quarantine that ends early (its connection or channel closed) takes the
// queue with it (it is auto-deleted), so the next claimer finds the queue
// missing and starts one over. A token never delivered is either its
// life's first (Init's, or a grown slot's) or a repair's copy, issued
// after the repair itself held the slot for W (see Inventory.Issue): no
// holder of its slot can believe, and it claims at once.

// claim turns a delivery into a permit. Junk, forged, foreign and retired
// tokens are removed (acked). The slot is claimed with an exclusive
// consumer on the slot's claim queue (see claimSlot): the broker refuses a
// second exclusive consumer (403) while the first exists, and drops it
// when its channel or connection closes. A token whose slot is claimed
// already (by this process or another) is a duplicate, or its holder's
// connection is just closing: it goes back (the channel is closed) and the
// caller retries after a pause.
//
// The token is checked again once the claim is held, against a
// configuration whose read began less than configTTL before: a repair
// that names a slot's new current token waits configTTL before it issues
// it (see Inventory.Issue), so a token it retired is either claimed before
// the new one exists, or refused.
func (s *Semaphore) claim(ctx context.Context, pc *pooledChannel, d amqp.Delivery, noWait bool) (*Permit, error) {
	tok, _, err := s.admit(ctx, d.Body)
	switch {
	case errors.Is(err, driver.ErrNotCurrent):
		s.log.Warn("removing an invalid token message", "reason", err)
		_ = d.Ack(false)
		return nil, errRetry{}
	case err != nil:
		// Could not check it (the configuration did not load): the
		// channel's close returns the token.
		return nil, err
	}
	if !s.reserve(tok.Index) {
		s.log.Warn("duplicate token of a slot this process holds; returning it", "index", tok.Index)
		return nil, errRetry{backoff: true}
	}
	if err := s.claimSlot(ctx, pc, tok.Index, d, noWait); err != nil {
		s.unreserve(tok.Index)
		var retry errRetry
		switch {
		case errors.As(err, &retry), ctx.Err() != nil:
			return nil, err
		case isCode(err, amqp.AccessRefused) || isCode(err, amqp.ResourceLocked):
			s.log.Debug("slot claimed by another holder; returning the token", "index", tok.Index)
			return nil, errRetry{backoff: true}
		}
		return nil, wrapBrokerErr(fmt.Sprintf("claim slot %d", tok.Index), err)
	}
	index := tok.Index
	tok, cfg, err := s.admit(ctx, d.Body)
	if err != nil {
		s.unreserve(index)
		if errors.Is(err, driver.ErrNotCurrent) {
			s.log.Warn("removing a token retired while its slot was being claimed", "reason", err)
			_ = d.Ack(false)
			return nil, errRetry{}
		}
		return nil, err
	}
	return s.newPermit(pc, d, tok, cfg), nil
}

// claimTag is the consumer tag of a slot claim on its holder's channel.
const claimTag = "tokensem-claim"

// claimSlot starts the exclusive consumer that claims a slot: one round
// trip when the claim queue exists. When it does not, the channel closes
// (404) and the token goes back, while this process starts the slot's
// quarantine (see above) in the background, or, if the token was never
// delivered, makes the claim queue again at once; the next token of the
// slot that reaches this process waits for that. noWait (TryAcquire) does
// not wait: it gives the token back.
func (s *Semaphore) claimSlot(ctx context.Context, pc *pooledChannel, index int, d amqp.Delivery, noWait bool) error {
	q := claimQueue(s.name, index)
	if !s.missingClaim(index) {
		_, err := pc.ch.Consume(q, claimTag, false, true, false, false, nil)
		if !isCode(err, amqp.NotFound) {
			return err
		}
		// The 404 closed the channel, and the token goes back: the
		// quarantine starts now, and the token's next claimer waits for it.
		s.markMissingClaim(index, true)
		s.startQuarantine(index, s.config().holdWait(), !delivered(d))
		return errRetry{}
	}
	cfg, err := s.freshConfig(ctx)
	if err != nil {
		return err
	}
	qu := s.startQuarantine(index, cfg.holdWait(), !delivered(d))
	if noWait {
		select {
		case <-qu.done:
		default:
			return errRetry{}
		}
	}
	select {
	case <-qu.done:
	case <-ctx.Done():
		return ctx.Err()
	case <-s.life.Done():
		return errRetry{}
	case <-pc.closed:
		return errRetry{backoff: true}
	case <-pc.sess.lost:
		return errRetry{}
	}
	switch {
	case denied(qu.err):
		return qu.err // the user may not make the claim queue: an admin's repair must
	case qu.err != nil:
		return errRetry{backoff: true} // someone else's quarantine, or a broker error: try again later
	}
	_, err = pc.ch.Consume(q, claimTag, false, true, false, false, nil)
	if err == nil {
		s.markMissingClaim(index, false)
	}
	return err
}

// delivered reports whether d's token was delivered before: requeued, or
// counted by a quorum queue.
func delivered(d amqp.Delivery) bool {
	return d.Redelivered || deliveryCount(d) > 0
}

// fence is the token's fence base (see config.fenceBase: its life's, or
// its slot's latest reissue's) plus the quorum queue's count of earlier
// returns of this message plus one: it grows every time the slot changes
// hands, and a later life's or reissue's base is above every fence before
// it. A quorum queue leaves the count out of a delivery that has none yet
// (seen on consumer deliveries: 0). Classic queues do not count, so there
// it is only the base.
func fence(d amqp.Delivery, tok tokensem.Token, cfg config) uint64 {
	base := cfg.fenceBase(tok)
	if cfg.QueueType != Quorum {
		return base
	}
	return base + uint64(deliveryCount(d)) + 1
}

// deliveryCount returns a quorum queue's count of the earlier returns of
// d's message (0 when the header is absent).
func deliveryCount(d amqp.Delivery) int64 {
	switch n := d.Headers["x-delivery-count"].(type) {
	case int64:
		return max(n, 0)
	case int32:
		return int64(max(n, 0))
	case int:
		return int64(max(n, 0))
	}
	return 0
}

// quarantine is one slot's quarantine, run by this Semaphore.
type quarantine struct {
	done chan struct{} // closed when it ends
	err  error         // why it ended without making the claim queue
}

// startQuarantine returns the slot's running quarantine, or starts one:
// in a goroutine of the Semaphore's (Close ends it, early: see above), it
// quarantines the slot's missing claim queue for wait and then makes it
// again. at once skips the wait (a token never delivered claims the slot).
func (s *Semaphore) startQuarantine(index int, wait time.Duration, atOnce bool) *quarantine {
	s.mu.Lock()
	defer s.mu.Unlock()
	if qu, ok := s.quarantines[index]; ok {
		return qu
	}
	qu := &quarantine{done: make(chan struct{})}
	if s.closed {
		qu.err = errors.New("amqpsem: closed")
		close(qu.done)
		return qu
	}
	s.quarantines[index] = qu
	s.tasks.Add(1)
	go func() {
		defer s.tasks.Done()
		qu.err = s.runQuarantine(index, wait, atOnce)
		s.mu.Lock()
		delete(s.quarantines, index)
		s.mu.Unlock()
		close(qu.done)
	}()
	return qu
}

func (s *Semaphore) runQuarantine(index int, wait time.Duration, atOnce bool) error {
	ctx := s.life
	ch, _, err := s.c.channel(ctx)
	if err != nil {
		return err
	}
	defer ch.Close() // ends an unfinished quarantine: its queue goes
	rctx, cancel := s.rtt(ctx)
	err = s.c.rpc(rctx, ch, func() error {
		if atOnce {
			_, err := ch.QueueDeclare(claimQueue(s.name, index), false, false, false, false, nil)
			return err
		}
		return s.quarantineClaim(ch, index, "tokensem-quarantine")
	}, nil)
	cancel()
	switch {
	case atOnce && err == nil:
		s.markMissingClaim(index, false)
		return nil
	case isCode(err, amqp.ResourceLocked):
		// Another connection quarantines it, or it exists again (as
		// every holder declares it): either way not this one's to make.
		s.markMissingClaim(index, false)
		return fmt.Errorf("amqpsem: slot %d's claim queue is someone else's", index)
	case err != nil:
		return wrapBrokerErr(fmt.Sprintf("quarantine slot %d", index), err)
	}
	s.log.Warn("a slot's claim queue went away (its node restarted or was lost): quarantining the slot until any holder cut off from the broker has given it up",
		"index", index, "wait", wait)
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	}
	rctx, cancel = s.rtt(ctx)
	defer cancel()
	err = s.c.rpc(rctx, ch, func() error { return s.endQuarantine(ch, index, "tokensem-quarantine") }, nil)
	if err != nil {
		return wrapBrokerErr(fmt.Sprintf("end the quarantine of slot %d", index), err)
	}
	s.markMissingClaim(index, false)
	return nil
}

// quarantineClaim declares slot index's claim queue, which is missing, as
// a queue exclusive to ch's connection and deleted with its last consumer,
// and consumes it exclusively with tag: no one else can claim the slot
// until endQuarantine, or until ch or its connection closes (which deletes
// the queue, so that the next claimer quarantines it again). An existing
// queue makes it fail with 405 RESOURCE_LOCKED.
func (s *Semaphore) quarantineClaim(ch *channel, index int, tag string) error {
	q := claimQueue(s.name, index)
	if _, err := ch.QueueDeclare(q, false, true, true, false, nil); err != nil {
		return err
	}
	_, err := ch.Consume(q, tag, false, true, false, false, nil)
	return err
}

// endQuarantine ends a quarantineClaim: the consumer's cancel deletes the
// quarantined queue, and the claim queue is declared as every holder
// declares it.
func (s *Semaphore) endQuarantine(ch *channel, index int, tag string) error {
	if err := ch.Cancel(tag, false); err != nil {
		return err
	}
	_, err := ch.QueueDeclare(claimQueue(s.name, index), false, false, false, false, nil)
	return err
}

func (s *Semaphore) reserve(index int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[index] {
		return false
	}
	s.held[index] = true
	return true
}

func (s *Semaphore) unreserve(index int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.held, index)
}

// missingClaim reports whether this process found slot index's claim
// queue missing, and has not seen it made again since.
func (s *Semaphore) missingClaim(index int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.missing[index]
}

func (s *Semaphore) markMissingClaim(index int, missing bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if missing {
		s.missing[index] = true
	} else {
		delete(s.missing, index)
	}
}

package amqpsem

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/permitstate"
)

var _ tokensem.Permit = (*Permit)(nil)

// errMaxHold is the cause of a loss when the permit was held for the
// maximum hold and released by the client.
var errMaxHold = errors.New("amqpsem: held for the maximum hold; released")

// Permit is a held permit of a RabbitMQ semaphore: an unacked delivery on a
// channel of its own plus the slot's exclusive claim queue. The broker
// requeues the token the moment the channel or connection closes, so the
// permit is lost exactly then; Done closes with it.
type Permit struct {
	s     *Semaphore
	pc    *pooledChannel
	tag   uint64
	tok   tokensem.Token
	fence uint64

	life   *permitstate.State // held, then released or lost
	stop   chan struct{}
	exited chan struct{}
}

func (s *Semaphore) newPermit(pc *pooledChannel, d amqp.Delivery, tok tokensem.Token, cfg config) *Permit {
	select {
	case <-pc.claimCancelled: // of an earlier claim on this channel
	default:
	}
	p := &Permit{s: s, pc: pc, tag: d.DeliveryTag, tok: tok, fence: fence(d, tok, cfg),
		life: permitstate.New(s.opts.Observer, s.name, s.Permits()), stop: make(chan struct{}), exited: make(chan struct{})}
	go p.run()
	s.log.Debug("permit acquired", "index", tok.Index, "fence", p.fence)
	return p
}

// run watches the permit until it is released or lost. A claim the broker
// cancels is a loss at once: the claim queue was deleted (the semaphore
// was deleted, or the queue's node restarted or was lost), and from then
// on nothing keeps another holder off the slot but the repair's and the
// next claimer's wait (see claim.go), which count on this holder giving
// up now. The channel is closed, which returns the token.
func (p *Permit) run() {
	defer close(p.exited)
	hold := time.NewTimer(p.s.opts.maxHold)
	defer hold.Stop()
	select {
	case <-p.stop:
	case <-p.pc.closed:
		p.lose(fmt.Errorf("amqpsem: channel closed, token requeued: %v", p.pc.closeErr()))
	case <-p.pc.sess.lost:
		p.lose(errors.New("amqpsem: connection lost, token requeued"))
	case <-hold.C:
		_ = p.giveBack()
		p.lose(errMaxHold)
	case <-p.pc.claimCancelled:
		p.lose(errClaimCancelled)
		_ = p.pc.ch.Close() // the token goes back
	}
}

// errClaimCancelled is the cause of the loss of a permit whose slot claim
// the broker cancelled.
var errClaimCancelled = errors.New("amqpsem: the broker cancelled the slot's claim (its claim queue was deleted: " +
	"the semaphore was deleted, or the queue's node restarted or was lost); token requeued")

// Token returns the held token.
func (p *Permit) Token() tokensem.Token { return p.tok }

// Fence returns the fencing number: the token's fence base (its issue
// time in microseconds: see docs/protocol-rabbitmq.md) plus its delivery count plus
// one on quorum queues; only the base on classic queues, which do not
// count deliveries.
func (p *Permit) Fence() uint64 { return p.fence }

// Deadline returns the zero time: an amqpsem permit has no lease; it is
// held until it is released or its connection drops (Done closes then).
func (p *Permit) Deadline() time.Time { return time.Time{} }

// Done is closed when the permit is released or lost.
func (p *Permit) Done() <-chan struct{} { return p.life.Done() }

// Err is nil while held, tokensem.ErrReleased after Release, and wraps
// tokensem.ErrLeaseLost after a loss.
func (p *Permit) Err() error { return p.life.Err() }

// ReportUse records how the holder's use of the permit went, for the
// Observer's EventRelease or EventLost (see tokensem.ReportUse).
func (p *Permit) ReportUse(took time.Duration, overloaded bool) { p.life.ReportUse(took, overloaded) }

func (p *Permit) lose(cause error) {
	if p.life.Lose(p.tok, cause) {
		p.s.unreserve(p.tok.Index)
		p.s.log.Warn("permit lost", "index", p.tok.Index, "cause", cause)
	}
}

// discard ends a permit that was never handed out (its acquire was
// abandoned): its watch stops first, so that nothing else uses the channel
// the abandoning rpc is about to close, which requeues the token.
func (p *Permit) discard(cause error) {
	close(p.stop)
	<-p.exited
	p.lose(cause)
}

// Release returns the token to the queue, where the broker hands it to the
// longest waiter. A second call returns tokensem.ErrReleased; after a loss
// it returns the loss and touches nothing. ctx is not used: the release is
// two one-way commands (the claim's cancel and the reject) and one round
// trip that confirms them, bounded by the connection's heartbeat, and a
// connection that fails meanwhile requeues the token anyway.
//
// Errors: tokensem.ErrReleased, an error wrapping tokensem.ErrLeaseLost.
func (p *Permit) Release(ctx context.Context) error {
	if err := p.life.BeginRelease(); err != nil {
		return err
	}
	close(p.stop)
	<-p.exited
	if err := p.Err(); err != nil {
		return err // lost while the watch stopped
	}
	if err := p.giveBack(); err != nil {
		// The channel is gone: the broker requeued the token when it closed.
		p.lose(fmt.Errorf("amqpsem: release: %w", err))
		return p.Err()
	}
	p.s.unreserve(p.tok.Index)
	return p.life.Released()
}

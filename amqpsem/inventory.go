package amqpsem

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/backoff"
	"github.com/tokensem/tokensem/reconciler"
)

var _ reconciler.Inventory = (*Inventory)(nil)

// Inventory is the reconciler's view of a RabbitMQ semaphore.
//
// RabbitMQ shows a queued message only by delivering it and cannot delete
// one by reference. So a census takes every ready token on a channel of its
// own and keeps them unacked until the run ends: Remove acknowledges the
// chosen ones, and the end of the run (or the next census) requeues the
// rest; if the reconciler dies, the broker requeues them. Held tokens
// cannot be read at all: the slots without a ready token are looked up in
// their claim queues, and the census reports the held ones as held and
// unseen (reconciler.Census.HeldUnseen). A ready copy of a held slot is
// found once its holder releases (the claim refuses it meanwhile). A slot is proven absent
// when no ready token and no claim names it, under the creation lock, which
// also keeps two reconcilers from issuing at once. A token that a waiter
// received but has not claimed yet is invisible for that instant: issuing
// its slot then makes a duplicate, which can never admit a second holder
// (the claim refuses it) and which the next run removes.
type Inventory struct {
	s *Semaphore

	mu   sync.Mutex
	ch   *channel // holds the ready tokens of the latest census
	pub  *channel // confirm-mode channel the run issues tokens on
	cfg  config
	at   time.Time // when the latest census looked up the claims
	base uint64    // fence base of the tokens this run issues; 0 until the first
}

// Inventory returns the semaphore's inventory for the reconciler.
func (s *Semaphore) Inventory() *Inventory { return &Inventory{s: s} }

// Lock takes the creation lock for the run; unlock requeues the tokens the
// latest census holds and releases the lock.
func (inv *Inventory) Lock(ctx context.Context) (func(), error) {
	unlock, err := inv.s.lock(ctx)
	if err != nil {
		return nil, err
	}
	inv.mu.Lock()
	inv.base = 0
	inv.mu.Unlock()
	return func() {
		inv.release()
		inv.mu.Lock()
		pub := inv.pub
		inv.pub = nil
		inv.mu.Unlock()
		if pub != nil {
			_ = pub.Close()
		}
		unlock()
	}, nil
}

// release requeues the tokens the latest census holds.
func (inv *Inventory) release() {
	inv.mu.Lock()
	ch := inv.ch
	inv.ch = nil
	inv.mu.Unlock()
	if ch != nil {
		_ = ch.Nack(0, true, true) // every outstanding delivery
		_ = ch.Close()
	}
}

// Census takes every ready token (keeping them until the run ends) and
// reads the claim queues.
//
// A broker that fails for a while (an election) is retried until ctx ends.
func (inv *Inventory) Census(ctx context.Context) (c reconciler.Census, err error) {
	err = inv.s.retry(ctx, "census", func() error {
		c, err = inv.census(ctx)
		return err
	})
	return c, err
}

// census is one try of Census.
func (inv *Inventory) census(ctx context.Context) (reconciler.Census, error) {
	s := inv.s
	if s.isClosed() {
		return reconciler.Census{}, tokensem.ErrClosed
	}
	inv.release()
	cfg, err := s.readConfig(ctx)
	if err != nil {
		return reconciler.Census{}, err
	}
	ch, _, err := s.c.channel(ctx)
	if err != nil {
		return reconciler.Census{}, err
	}
	ds, _, err := s.takeReady(ctx, ch)
	if err != nil {
		_ = ch.Close()
		return reconciler.Census{}, err
	}
	inv.mu.Lock()
	inv.ch, inv.cfg = ch, cfg
	inv.mu.Unlock()
	bodies := make([][]byte, len(ds))
	for i, d := range ds {
		bodies[i] = d.Body
	}
	inv.mu.Lock()
	inv.at = time.Now()
	inv.mu.Unlock()
	held, err := s.readClaims(ctx, s.unaccounted(bodies, cfg))
	if err != nil {
		return reconciler.Census{}, err
	}
	c := reconciler.Census{Permits: cfg.Permits, Epoch: cfg.Epoch, HeldSlots: held, HeldUnseen: true,
		Entries: make([]reconciler.Entry, 0, len(ds))}
	for _, d := range ds {
		e := reconciler.Classify(s.codec, s.name, cfg.Permits, cfg.Epoch, d.Body)
		e.Ref = strconv.FormatUint(d.DeliveryTag, 10)
		c.Entries = append(c.Entries, e)
	}
	return c, nil
}

// Remove acknowledges (deletes) one token the latest census holds.
func (inv *Inventory) Remove(ctx context.Context, e reconciler.Entry) error {
	tag, err := strconv.ParseUint(e.Ref, 10, 64)
	if err != nil {
		return fmt.Errorf("amqpsem: bad message reference %q", e.Ref)
	}
	inv.mu.Lock()
	ch := inv.ch
	inv.mu.Unlock()
	if ch == nil {
		return errors.New("amqpsem: Remove without a census")
	}
	return ch.Ack(tag, false)
}

// claimSettle is how long after a census Issue looks up a missing slot's
// claim again before it issues a token. A holder whose claim queue went
// away with its node (the token queue and the holder's own connection
// fine) is told by the broker within milliseconds and claims again at once
// (see Permit.reclaim); a census in that moment sees the slot neither ready
// nor claimed.
const claimSettle = time.Second

// Issue publishes a token for index, with a publisher confirm. Call it only
// for a slot the latest census, taken under Lock, proved absent. It looks
// the slot's claim up once more, claimSettle after the census, and returns
// reconciler.ErrConflict if the slot is claimed by then.
func (inv *Inventory) Issue(ctx context.Context, index int) error {
	inv.mu.Lock()
	cfg, at := inv.cfg, inv.at
	inv.mu.Unlock()
	if cfg.Permits == 0 {
		return errors.New("amqpsem: Issue before Census")
	}
	if index < 0 || index >= cfg.Permits {
		return fmt.Errorf("amqpsem: slot %d outside [0, %d)", index, cfg.Permits)
	}
	s := inv.s
	if err := backoff.Sleep(ctx, time.Until(at.Add(claimSettle))); err != nil {
		return err
	}
	switch held, err := s.readClaims(ctx, []int{index}); {
	case err != nil:
		return err
	case len(held) > 0:
		return reconciler.ErrConflict // claimed again since the census
	}
	ch, err := inv.publishChannel(ctx)
	if err != nil {
		return err
	}
	base, err := inv.fenceBase(ctx)
	if err != nil {
		return err
	}
	tok := tokensem.NewToken(s.name, index, cfg.Epoch)
	b, err := s.codec.Encode(tok)
	if err != nil {
		return err
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", QueueName(s.name), true, false, amqp.Publishing{
		DeliveryMode: amqp.Persistent, ContentType: "text/plain", MessageId: tok.ID, Body: b,
		Headers: amqp.Table{fenceBaseHeader: int64(base)},
	})
	if err != nil {
		return wrapBrokerErr(fmt.Sprintf("issue slot %d", index), err)
	}
	if err := s.c.waitConfirms(ctx, []*amqp.DeferredConfirmation{dc}); err != nil {
		return err
	}
	s.log.Info("issued a token for a missing slot", "index", index)
	return nil
}

// publishChannel returns the run's confirm-mode channel, opening it on the
// first Issue (or again after a broker error closed it); unlock closes it.
func (inv *Inventory) publishChannel(ctx context.Context) (*channel, error) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	if inv.pub != nil && !inv.pub.IsClosed() {
		return inv.pub, nil
	}
	ch, err := inv.s.c.confirmChannel(ctx)
	if err != nil {
		return nil, err
	}
	inv.pub = ch
	return ch, nil
}

// fenceBase returns the fence base of the tokens this run issues. The
// first Issue of a run moves the stored fence generation on, so a reissued
// slot's fences continue above its lost token's.
func (inv *Inventory) fenceBase(ctx context.Context) (uint64, error) {
	inv.mu.Lock()
	base := inv.base
	inv.mu.Unlock()
	if base != 0 {
		return base, nil
	}
	s := inv.s
	cfg, err := s.readConfig(ctx)
	if err != nil {
		return 0, err
	}
	cfg.FenceGen++
	cfg.Seq++
	if err := s.writeConfig(ctx, cfg); err != nil {
		return 0, err
	}
	s.setConfig(cfg)
	base = cfg.FenceGen << fenceGenShift
	inv.mu.Lock()
	inv.base, inv.cfg = base, cfg
	inv.mu.Unlock()
	return base, nil
}

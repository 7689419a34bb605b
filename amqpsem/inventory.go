package amqpsem

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/driver"
	"github.com/tokensem/tokensem/internal/backoff"
)

var _ driver.Inventory = (*Inventory)(nil)

// Inventory is the reconciler's view of a RabbitMQ semaphore.
//
// RabbitMQ shows a queued message only by delivering it and cannot delete
// one by reference. So a census takes every ready token on a channel of its
// own and keeps them unacked until the run ends: Remove acknowledges the
// chosen ones, and the end of the run (or the next census) requeues the
// rest; if the reconciler dies, the broker requeues them. Held tokens
// cannot be read at all: the slots without a ready token are looked up in
// their claim queues, and the census reports the held ones as held and
// unseen (driver.Census.HeldUnseen). A ready copy of a held slot is
// found once its holder releases (the claim refuses it meanwhile). A slot
// is proven absent when no ready token and no claim names it, under the
// creation lock, which also keeps two reconcilers from issuing at once.
// Tokens of a reissued slot other than its current one are retired (see
// classify), and removed.
//
// The run's work happens on the connection that holds the lock (see
// Semaphore.takeLock): once that connection is lost, Census, Remove and
// Issue fail.
type Inventory struct {
	s *Semaphore

	mu     sync.Mutex
	sess   *session      // the lock's connection, while locked
	ch     *channel      // holds the ready tokens of the latest census
	pub    *channel      // confirm-mode channel the run issues tokens on
	cfg    config        // as the run last read or wrote it
	seen   config        // as the latest census read it
	latest driver.Census // the latest census
	hold   *reissueHold  // the claims held for the latest census's reissues
}

// Inventory returns the semaphore's inventory for the reconciler.
func (s *Semaphore) Inventory() *Inventory { return &Inventory{s: s} }

// Lock takes the creation lock for the run; unlock requeues the tokens the
// latest census holds, drops the claims the run holds, and releases the
// lock.
func (inv *Inventory) Lock(ctx context.Context) (func(), error) {
	ctx, unlock, err := inv.s.lock(ctx)
	if err != nil {
		return nil, err
	}
	inv.mu.Lock()
	inv.sess = pinnedSession(ctx)
	inv.mu.Unlock()
	return func() {
		inv.release()
		inv.mu.Lock()
		pub := inv.pub
		inv.pub, inv.sess = nil, nil
		inv.mu.Unlock()
		if pub != nil {
			_ = pub.Close()
		}
		unlock()
	}, nil
}

// pin binds ctx to the lock's connection (see pin), when the run holds the
// lock.
func (inv *Inventory) pin(ctx context.Context) context.Context {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	if inv.sess == nil {
		return ctx
	}
	return pin(ctx, inv.sess)
}

// release requeues the tokens the latest census holds, and drops the
// claims held for its reissues.
func (inv *Inventory) release() {
	inv.releaseReady()
	inv.mu.Lock()
	h := inv.hold
	inv.hold = nil
	inv.mu.Unlock()
	h.release()
}

// releaseReady requeues the tokens the latest census holds.
func (inv *Inventory) releaseReady() {
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
func (inv *Inventory) Census(ctx context.Context) (c driver.Census, err error) {
	ctx = inv.pin(ctx)
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
	inv.release()
	cfg, err := s.readConfig(ctx)
	if err != nil {
		return driver.Census{}, err
	}
	if err := s.checkSquatted(ctx, cfg); err != nil {
		return driver.Census{}, err
	}
	ch, _, err := s.c.channel(ctx)
	if err != nil {
		return driver.Census{}, err
	}
	ds, consumers, err := s.takeReady(ctx, ch)
	if err != nil {
		_ = ch.Close()
		return driver.Census{}, err
	}
	inv.mu.Lock()
	inv.ch, inv.cfg, inv.seen = ch, cfg, cfg
	inv.mu.Unlock()
	bodies := make([][]byte, len(ds))
	for i, d := range ds {
		bodies[i] = d.Body
	}
	held, err := s.readHolders(ctx, cfg, bodies, consumers)
	if err != nil {
		return driver.Census{}, err
	}
	c := driver.Census{Permits: cfg.Permits, Epoch: cfg.Epoch, HeldSlots: held, HeldUnseen: true,
		Entries: make([]driver.Entry, 0, len(ds))}
	for _, d := range ds {
		e := s.classify(cfg, d.Body)
		e.Ref = strconv.FormatUint(d.DeliveryTag, 10)
		c.Entries = append(c.Entries, e)
	}
	inv.mu.Lock()
	inv.latest = c
	inv.mu.Unlock()
	return c, nil
}

// checkSquatted fails with ErrClaimsSquatted when slot claims are held
// without a token (see Semaphore.squatted): the census would take a
// squatted slot's ready token for a duplicate of a held one, and a repair
// would remove it. It looks before the census takes any token, which the
// queue would count as consumers; above fullClaimCensus permits it does
// not look (a census there looks up only the slots without a ready
// token).
func (s *Semaphore) checkSquatted(ctx context.Context, cfg config) error {
	if cfg.QueueType != Quorum || cfg.Permits > fullClaimCensus {
		return nil
	}
	info, _, err := s.queueInfo(ctx, tokenQueue(s.name))
	if err != nil {
		return err
	}
	held, err := s.readClaims(ctx, allSlots(cfg.Permits))
	if err != nil {
		return err
	}
	switch n, err := s.squatted(ctx, held, info.Consumers); {
	case err != nil:
		return err
	case n > 0:
		return fmt.Errorf("%w: %s: %s", ErrClaimsSquatted, s.name, squatWarning(n))
	}
	return nil
}

// Remove acknowledges (deletes) one token the latest census holds.
func (inv *Inventory) Remove(ctx context.Context, e driver.Entry) error {
	tag, err := strconv.ParseUint(e.Ref, 10, 64)
	if err != nil {
		return fmt.Errorf("amqpsem: bad message reference %q", e.Ref)
	}
	inv.mu.Lock()
	ch, sess := inv.ch, inv.sess
	inv.mu.Unlock()
	switch {
	case ch == nil:
		return errors.New("amqpsem: Remove without a census")
	case sess != nil && isDone(sess.lost):
		return errLockLost
	}
	return ch.Ack(tag, false)
}

// Issue publishes a token for index, with a publisher confirm. Call it
// only for a slot the latest census, taken under Lock, proved absent.
//
// A slot that never had a token in this life (a grown semaphore's new
// slot) gets one at once, its claim queue first. Any other slot may have a
// holder that is cut off from the broker and still believes it holds, for
// up to W after its claim went away (see Conn.holdBound), while its token
// is out of sight; and its old token may come back (an orphan, see
// WithOrphanRepair). So the first Issue after a census claims every
// missing slot the census found, as a holder would (quarantining a claim
// queue that went away, see claim.go), names a new current token for each
// in the configuration (its ID and a fence base above every fence before
// it, see nextFenceBase), and holds the claims for W and a third from when
// they were all held, and for at least configTTL after the configuration
// was written, so that every client admits by it. Then each Issue lets its
// slot's claim go and publishes the new token: every holder that could
// believe it held the slot has been told or has passed W, and the old
// token, if it returns, is retired. A slot that was claimed when the
// claims were taken, or whose claim the broker cancelled meanwhile (its
// queue's node was lost), is driver.ErrConflict.
func (inv *Inventory) Issue(ctx context.Context, index int) error {
	inv.mu.Lock()
	cfg := inv.seen
	inv.mu.Unlock()
	if cfg.Permits == 0 {
		return errors.New("amqpsem: Issue before Census")
	}
	if index < 0 || index >= cfg.Permits {
		return fmt.Errorf("amqpsem: slot %d outside [0, %d)", index, cfg.Permits)
	}
	ctx = inv.pin(ctx)
	if !cfg.issued(index) {
		return inv.issueNew(ctx, index)
	}
	h, err := inv.holdReissues(ctx)
	if err != nil {
		return err
	}
	return h.issue(ctx, inv, index)
}

// issueNew issues the first token of a slot that never had one in this
// life: nobody can hold it or believe so. The configuration records first
// that every slot below the permits has been issued, and their claim
// queues are declared (see claim.go).
func (inv *Inventory) issueNew(ctx context.Context, index int) error {
	s := inv.s
	inv.mu.Lock()
	cfg := inv.cfg
	inv.mu.Unlock()
	if cfg.Issued < cfg.Permits {
		ch, _, err := s.c.channel(ctx)
		if err != nil {
			return err
		}
		err = s.declareClaims(ctx, ch, cfg.Issued, cfg.Permits)
		_ = ch.Close()
		if err != nil {
			return err
		}
		cfg.Issued, cfg.Seq = cfg.Permits, cfg.Seq+1
		if err := s.writeConfig(ctx, cfg); err != nil {
			return err
		}
		s.setConfig(cfg)
		inv.mu.Lock()
		inv.cfg = cfg
		inv.mu.Unlock()
	}
	if err := inv.publish(ctx, driver.NewToken(s.name, index, cfg.Epoch)); err != nil {
		return err
	}
	s.log.Info("issued the first token of a new slot", "index", index)
	return nil
}

// reissueHold is the claims an Inventory holds for the reissues of its
// latest census (see Issue).
type reissueHold struct {
	mu    sync.Mutex
	slots map[int]*heldSlot // the slots held, until issued
	err   error             // why the hold failed, for every Issue
}

// heldSlot is one slot claimed by a repair.
type heldSlot struct {
	ch          *channel
	tok         tokensem.Token // the slot's new current token
	quarantined bool           // its claim queue had gone away (see quarantineClaim)
	cancelled   atomic.Bool    // the broker cancelled the claim
}

const repairTag = "tokensem-repair"

// holdReissues takes the hold of the latest census, on its first call.
func (inv *Inventory) holdReissues(ctx context.Context) (*reissueHold, error) {
	inv.mu.Lock()
	if h := inv.hold; h != nil {
		inv.mu.Unlock()
		return h, h.err
	}
	h := &reissueHold{slots: map[int]*heldSlot{}}
	inv.hold = h
	seen, census := inv.seen, inv.latest
	inv.mu.Unlock()
	h.err = inv.takeHold(ctx, h, seen, census)
	if h.err != nil {
		h.release()
	}
	return h, h.err
}

func (inv *Inventory) takeHold(ctx context.Context, h *reissueHold, seen config, census driver.Census) error {
	s := inv.s
	for _, i := range driver.Analyze(census).Missing {
		if !seen.issued(i) {
			continue // issued by issueNew
		}
		hs, err := s.holdSlot(ctx, i)
		switch {
		case errors.Is(err, driver.ErrConflict):
			continue
		case err != nil:
			return err
		}
		h.slots[i] = hs
	}
	if len(h.slots) == 0 {
		return nil
	}
	inv.mu.Lock()
	cfg := inv.cfg // with what issueNew wrote
	inv.mu.Unlock()
	heldAt := time.Now()
	base := nextFenceBase(cfg.maxFenceBase())
	next := cfg
	for i, hs := range h.slots {
		hs.tok = driver.NewToken(s.name, i, cfg.Epoch)
		next = next.withReissued(i, hs.tok, base)
	}
	next.Seq++
	if err := s.writeConfig(ctx, next); err != nil {
		return err
	}
	wrote := time.Now()
	s.setConfig(next)
	inv.mu.Lock()
	inv.cfg = next
	inv.mu.Unlock()
	// The census's own hold on the ready tokens would count below: Remove
	// comes before Issue in a run, so they go back now.
	inv.releaseReady()
	s.log.Info("holding the claims of missing slots before issuing them, until any holder cut off from the broker has given them up",
		"slots", len(h.slots), "wait", cfg.holdWait())
	// A holder cut off from the broker holds its token unacked on a
	// channel the broker still counts alive, so a quorum token queue that
	// counts no consumer at some moment while the repair holds the slots
	// has no such holder of them (and none can come: the repair holds
	// their claims). The wait for W ends then; configTTL's does not.
	return s.waitHeld(ctx, cfg, heldAt.Add(cfg.holdWait()), wrote.Add(configTTL))
}

// waitHeld waits, holding claims, until both believers (see tokensOut)
// and config have passed: believers is the time by which every holder
// that could believe it holds has given up, cut short once the token
// queue shows no holder at all; config is when every client admits by the
// configuration last written.
func (s *Semaphore) waitHeld(ctx context.Context, cfg config, believers, config time.Time) error {
	for {
		now := time.Now()
		if !now.Before(believers) && !now.Before(config) {
			return nil
		}
		if now.Before(believers) {
			switch out, err := s.tokensOut(ctx, cfg); {
			case err != nil:
				return err
			case !out:
				believers = now
				continue
			}
		}
		next := config
		if now.Before(believers) {
			next = now.Add(tokensOutPoll)
		}
		if err := backoff.Sleep(ctx, time.Until(next)); err != nil {
			return err
		}
	}
}

// tokensOutPoll is how often waitHeld looks at the token queue's
// consumers.
const tokensOutPoll = 50 * time.Millisecond

// holdSlot claims slot index for a repair, on a channel of its own: the
// claim queue's exclusive consumer, or, when the queue went away, its
// quarantine (see quarantineClaim). A slot claimed by someone else is
// driver.ErrConflict.
func (s *Semaphore) holdSlot(ctx context.Context, index int) (*heldSlot, error) {
	for quarantine := false; ; quarantine = true {
		ch, _, err := s.c.channel(ctx)
		if err != nil {
			return nil, err
		}
		hs := &heldSlot{ch: ch, quarantined: quarantine}
		cancels := ch.NotifyCancel(make(chan string, 1))
		go func() {
			for range cancels { // until amqp091 closes it with the channel
				hs.cancelled.Store(true)
			}
		}()
		rctx, cancel := s.rtt(ctx)
		err = s.c.rpc(rctx, ch, func() error {
			if quarantine {
				return s.quarantineClaim(ch, index, repairTag)
			}
			_, err := ch.Consume(claimQueue(s.name, index), repairTag, false, true, false, false, nil)
			return err
		}, nil)
		cancel()
		switch {
		case err == nil:
			return hs, nil
		case isCode(err, amqp.NotFound) && !quarantine:
			_ = ch.Close()
			continue // its claim queue went away
		case isCode(err, amqp.AccessRefused), isCode(err, amqp.ResourceLocked):
			_ = ch.Close()
			return nil, driver.ErrConflict // claimed, or quarantined by another
		}
		_ = ch.Close()
		return nil, wrapBrokerErr(fmt.Sprintf("claim slot %d to issue it", index), err)
	}
}

// issue lets slot index's claim go, after checking that it was held all
// along, and publishes the slot's new token.
func (h *reissueHold) issue(ctx context.Context, inv *Inventory, index int) error {
	h.mu.Lock()
	hs := h.slots[index]
	delete(h.slots, index)
	h.mu.Unlock()
	if hs == nil {
		return driver.ErrConflict // claimed by someone else when the hold began
	}
	defer hs.ch.Close()
	s := inv.s
	rctx, cancel := s.rtt(ctx)
	// A cancel the broker sent before this round trip's answer has been
	// seen once it returns: amqp091 hands a channel's frames on in order.
	err := s.c.rpc(rctx, hs.ch, func() error {
		if hs.quarantined {
			return s.endQuarantine(hs.ch, index, repairTag)
		}
		return hs.ch.Cancel(repairTag, false)
	}, nil)
	cancel()
	switch {
	case err != nil:
		return wrapBrokerErr(fmt.Sprintf("end the claim of slot %d", index), err)
	case hs.cancelled.Load():
		s.log.Warn("the claim of a missing slot was cancelled by the broker while the repair held it (its node was lost); not issuing it", "index", index)
		return driver.ErrConflict
	}
	if err := inv.publish(ctx, hs.tok); err != nil {
		return err
	}
	s.log.Info("issued a token for a missing slot", "index", index)
	return nil
}

// release drops the claims still held (nil: none).
func (h *reissueHold) release() {
	if h == nil {
		return
	}
	h.mu.Lock()
	slots := h.slots
	h.slots = nil
	h.mu.Unlock()
	for _, hs := range slots {
		_ = hs.ch.Close() // a quarantined claim queue goes with its consumer
	}
}

// publish publishes tok on the run's confirm-mode channel and waits for
// the broker's confirm.
func (inv *Inventory) publish(ctx context.Context, tok tokensem.Token) error {
	s := inv.s
	ch, err := inv.publishChannel(ctx)
	if err != nil {
		return err
	}
	b, err := s.codec.Encode(tok)
	if err != nil {
		return err
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchangeName(s.name), tokenQueue(s.name), true, false, amqp.Publishing{
		DeliveryMode: amqp.Persistent, ContentType: "text/plain", MessageId: tok.ID, Body: b,
	})
	if err != nil {
		return wrapBrokerErr(fmt.Sprintf("issue slot %d", tok.Index), err)
	}
	return s.c.waitConfirms(ctx, ch, []*amqp.DeferredConfirmation{dc})
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
	q := tokenQueue(inv.s.name)
	if err := inv.s.c.rpc(ctx, ch, func() error { return inv.s.bind(ch, q) }, nil); err != nil {
		_ = ch.Close()
		return nil, wrapBrokerErr("bind "+q+" to its exchange", err)
	}
	inv.pub = ch
	return ch, nil
}

package amqpsem

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/driver"
	"github.com/tokensem/tokensem/internal/backoff"
)

// Status takes a census. RabbitMQ cannot show a queued message without
// delivering it, so the census takes every ready token,
// reads it, and requeues them all (they are unavailable for that instant,
// and go to the back of the queue). Held tokens cannot be read at all; the
// slots without a ready token are looked up in their claim queues (a holder
// keeps an exclusive consumer on its slot's claim queue, so a passive
// declare shows one consumer). Above fullClaimCensus permits only the slots
// without a ready token are looked up, so a ready copy of a held slot shows
// as a duplicate only once the holder releases; the claim refuses it
// meanwhile. A broker that fails for a while (an election) is retried until
// ctx ends. A token on its way between holders is seen neither ready nor
// held for a moment; the census looks again at such slots (readHolders),
// and a token still on its way after that shows as missing for that one
// census.
//
// Errors: tokensem.ErrClosed, tokensem.ErrNotInitialized, or a wrapped
// broker error.
func (s *Semaphore) Status(ctx context.Context) (st tokensem.Status, err error) {
	err = s.retry(ctx, "status", func() error {
		st, err = s.status(ctx)
		return err
	})
	return st, err
}

// status is one try of Status.
func (s *Semaphore) status(ctx context.Context) (tokensem.Status, error) {
	if s.isClosed() {
		return tokensem.Status{}, tokensem.ErrClosed
	}
	cfg, err := s.readConfig(ctx)
	if err != nil {
		return tokensem.Status{}, err
	}
	s.setConfig(cfg)

	ready, waiting, err := s.readReady(ctx)
	if err != nil {
		return tokensem.Status{}, err
	}
	held, err := s.readHolders(ctx, cfg, ready, waiting)
	if err != nil {
		return tokensem.Status{}, err
	}
	c := driver.Census{Permits: cfg.Permits, Epoch: cfg.Epoch, HeldSlots: held, HeldUnseen: true}
	for _, b := range ready {
		c.Entries = append(c.Entries, s.classify(cfg, b))
	}
	st := driver.Summarize(c)
	st.Name, st.Backend, st.Resource, st.Waiting = s.name, "amqp", tokenQueue(s.name), waiting
	for _, idx := range held { // readClaims returns them in index order
		st.Holders = append(st.Holders, tokensem.Holder{Index: idx})
	}
	if cfg.QueueType == Quorum {
		// A quorum queue counts as a consumer everyone holding an unacked
		// token of it (basic.get or a cancelled consumer alike): measured on
		// 3.10.8. Each holder holds exactly one.
		st.Waiting = max(0, waiting-len(held))
		if w := orphanWarning(st); w != "" {
			st.Warnings = append(st.Warnings, w)
		}
		n, err := s.squatted(ctx, held, waiting)
		if err != nil {
			return tokensem.Status{}, err
		}
		if n > 0 {
			st.Healthy = false
			st.Warnings = append(st.Warnings, squatWarning(n))
		}
	}
	return st, nil
}

// ErrClaimsSquatted fails a reconcile (Inventory.Census) while slot
// claims are held by connections that hold no token (see Status): it
// could not tell a held slot's duplicate token from a squatted slot's
// only one, and would remove the latter.
var ErrClaimsSquatted = errors.New("amqpsem: slot claims held without a token (squatted)")

// squatted returns how many slots are claimed by connections that hold no
// token of a quorum token queue: every holder holds a token unacked, which
// the queue counts as a consumer, so more claims than consumers are
// claims without a token. A client of the semaphore may hold its claim
// queues' exclusive consumers, or declare a missing one exclusive, and
// keep the slots from every acquirer while their tokens lie ready; a
// repair's or a quarantine's hold looks the same while it lasts. Counts
// can lag a moment, so it looks twice, 250 ms apart.
func (s *Semaphore) squatted(ctx context.Context, held []int, consumers int) (int, error) {
	if len(held) <= consumers {
		return 0, nil
	}
	if err := backoff.Sleep(ctx, 250*time.Millisecond); err != nil {
		return 0, err
	}
	info, _, err := s.queueInfo(ctx, tokenQueue(s.name))
	if err != nil {
		return 0, err
	}
	again, err := s.readClaims(ctx, held)
	if err != nil {
		return 0, err
	}
	return max(0, len(again)-info.Consumers), nil
}

func squatWarning(n int) string {
	return fmt.Sprintf("%d slot claim(s) are held by connections that hold no token (claim queues squatted by a client of the semaphore, "+
		"or a repair or quarantine under way): acquirers of those slots are refused until they let go; "+
		"rabbitmqctl list_consumers shows the channels holding the tokensem.NAME.claim.I queues", n)
}

// orphanWarning says when the census suggests tokens checked out to
// consumers that no longer exist. AMQP shows no count of unacknowledged
// messages, but such a consumer stays in the token queue's consumer count
// (measured on 3.10.8: while its node is down, and in rabbitmq-server's open
// issue until the queue's leader restarts), so it looks like a waiter; yet a
// real waiter would be given a ready token, or the missing one. Ready or
// missing tokens beside "waiters" point at orphans.
func orphanWarning(st tokensem.Status) string {
	if st.Waiting == 0 || st.Available == 0 && len(st.Missing) == 0 {
		return ""
	}
	return fmt.Sprintf("the token queue counts %d consumer(s) that neither hold a permit nor take the %d available token(s)%s: "+
		"consumers on a node that went away, whose tokens RabbitMQ may keep unacknowledged until the queue's leader restarts "+
		"(rabbitmqctl list_queues name messages_unacknowledged consumers shows them); reconcile --repair keeps the permits usable "+
		"meanwhile and removes the copies when they return",
		st.Waiting, st.Available, missingNote(st.Missing))
}

func missingNote(missing []int) string {
	if len(missing) == 0 {
		return ""
	}
	return fmt.Sprintf(", while slots %v have no token", missing)
}

// readReady takes every ready token message, returns their bodies and the
// number of consumers, and requeues the messages.
func (s *Semaphore) readReady(ctx context.Context) ([][]byte, int, error) {
	ch, _, err := s.c.channel(ctx)
	if err != nil {
		return nil, 0, err
	}
	defer ch.Close()
	ds, consumers, err := s.takeReady(ctx, ch)
	if err != nil {
		return nil, 0, err
	}
	bodies := make([][]byte, len(ds))
	for i, d := range ds {
		bodies[i] = d.Body
	}
	if len(ds) > 0 {
		if err := ch.Nack(ds[len(ds)-1].DeliveryTag, true, true); err != nil {
			return nil, 0, wrapBrokerErr("census requeue", err)
		}
	}
	return bodies, consumers, nil
}

// takeReady takes every ready token message on ch without acknowledging
// them (they stay out of reach until acked, requeued or ch closes) and
// returns them with the queue's consumer count. Many tokens are streamed
// to a consumer, which costs no round trip per message (basic.get costs
// one: 0.64 ms each for a 10,000-token quorum queue on the 2-core
// development machine); basic.get then takes the rest until the broker
// answers empty, which proves no ready token was left behind.
func (s *Semaphore) takeReady(ctx context.Context, ch *channel) ([]amqp.Delivery, int, error) {
	var q amqp.Queue
	var ds []amqp.Delivery
	err := s.c.rpc(ctx, ch, func() error {
		var err error
		if q, err = ch.QueueDeclarePassive(tokenQueue(s.name), true, false, false, false, nil); err != nil {
			return err
		}
		// The count may miss tokens being requeued at this instant (by the
		// previous census of a reconcile run, say): a large semaphore
		// streams whatever its count.
		if max(q.Messages, s.config().Permits) >= streamCensusMin {
			if ds, err = s.streamReady(ctx, ch, q.Messages); err != nil {
				return err
			}
		}
		for ctx.Err() == nil { // once abandoned, take no more
			d, ok, err := ch.Get(tokenQueue(s.name), false)
			if err != nil || !ok {
				return err
			}
			ds = append(ds, d)
		}
		return ctx.Err()
	}, nil)
	if err != nil {
		if isCode(err, amqp.NotFound) {
			return nil, 0, fmt.Errorf("%w: token queue %s is gone", tokensem.ErrNotInitialized, tokenQueue(s.name))
		}
		return nil, 0, wrapBrokerErr("census", err)
	}
	return ds, q.Consumers, nil
}

const (
	// streamCensusMin is the number of permits or ready tokens from which
	// a census consumes them instead of getting them one by one.
	streamCensusMin = 64
	// streamCensusIdle ends the streaming phase of a census when no token
	// came for this long, and streamCensusSettle once the queue's count at
	// the start has arrived. The stream does not stop at that count:
	// tokens requeued just before (by the previous census of a reconcile
	// run, say) are not all counted yet, and each one left to basic.get
	// costs a round trip.
	streamCensusIdle   = 100 * time.Millisecond
	streamCensusSettle = 10 * time.Millisecond
)

// streamReady consumes ready tokens, keeping them unacked, until none came
// for a moment, then cancels the consumer; the deliveries already on their
// way are kept too. counted is the queue's ready count at the start.
func (s *Semaphore) streamReady(ctx context.Context, ch *channel, counted int) ([]amqp.Delivery, error) {
	// Every token stays unacked until the census ends, so the prefetch
	// limit (at most 65535 in AMQP 0-9-1) must cover them all; if it does
	// not, basic.get takes the rest.
	if err := ch.Qos(min(max(counted, s.config().Permits)+streamCensusMin, math.MaxUint16), 0, false); err != nil {
		return nil, err
	}
	tag := "tokensem-census-" + driver.NewToken(s.name, 0, 1).ID
	deliveries, err := ch.Consume(tokenQueue(s.name), tag, false, false, false, false, amqp.Table{"x-priority": int32(censusPriority)})
	if err != nil {
		return nil, err
	}
	ds := make([]amqp.Delivery, 0, counted)
	idle := time.NewTimer(streamCensusIdle)
	defer idle.Stop()
stream:
	for {
		select {
		case d, ok := <-deliveries:
			if !ok {
				break stream
			}
			ds = append(ds, d)
			if len(ds) >= counted {
				idle.Reset(streamCensusSettle)
			} else {
				idle.Reset(streamCensusIdle)
			}
		case <-idle.C:
			break stream
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if err := ch.Cancel(tag, false); err != nil {
		return nil, err
	}
	for d := range deliveries { // amqp091 closes it once the buffered ones are out
		ds = append(ds, d)
	}
	return ds, nil
}

// readHolders returns the held slots of a census that found the valid
// ready tokens among ready (see unaccounted). Under churn most censuses
// catch a token on its way between holders: delivered to a waiter that
// has not yet claimed its slot, or released and not yet requeued. Its
// slot is seen neither ready nor held, yet is claimed a moment later (a
// waiter claims as soon as a token reaches it). So the slots seen neither
// way are looked at again, inFlightLooks times over about half a second
// (a caller on a loaded machine may take that long to claim), before
// the census calls them missing: a repair would otherwise hold such a
// slot's claim for W and a third (see Inventory.Issue) and issue it a
// second token. A slot found held on a later look is held (a claim is
// never a missing slot), so looking again only ever spares a repair. A
// quorum token queue with no consumer (consumers, counted as the census
// took the ready tokens) has no token on its way: every holder and every
// waiter that got a token counts as one.
func (s *Semaphore) readHolders(ctx context.Context, cfg config, ready [][]byte, consumers int) ([]int, error) {
	valid := s.readySlots(ready, cfg) // once: the ready tokens do not change between looks
	held, err := s.readClaims(ctx, unaccounted(valid, cfg))
	if err != nil {
		return nil, err
	}
	if cfg.QueueType == Quorum && consumers == 0 {
		return held, nil
	}
	pause := backoff.Backoff{Min: 20 * time.Millisecond, Max: 160 * time.Millisecond}
	for range inFlightLooks {
		away := unseen(valid, cfg, held)
		if len(away) == 0 {
			break
		}
		if err := pause.Wait(ctx, nil); err != nil {
			return nil, err
		}
		more, err := s.readClaims(ctx, away)
		if err != nil {
			return nil, err
		}
		held = append(held, more...)
		slices.Sort(held)
	}
	return held, nil
}

// inFlightLooks is how many more times readHolders looks at the slots seen
// neither ready nor held.
const inFlightLooks = 5

// readySlots marks the slots in [0, permits) that have a valid token among
// ready.
func (s *Semaphore) readySlots(ready [][]byte, cfg config) []bool {
	seen := make([]bool, cfg.Permits)
	for _, b := range ready {
		if e := s.classify(cfg, b); e.Valid {
			seen[e.Token.Index] = true
		}
	}
	return seen
}

// unseen returns the slots in [0, permits) neither marked in valid (a
// valid ready token) nor in held, that have had a token in this life: a
// slot never issued (one a growth adds) has no token on its way.
func unseen(valid []bool, cfg config, held []int) []int {
	seen := slices.Clone(valid)
	for _, i := range held {
		if i >= 0 && i < cfg.Permits {
			seen[i] = true
		}
	}
	var out []int
	for i, ok := range seen {
		if !ok && cfg.issued(i) {
			out = append(out, i)
		}
	}
	return out
}

// readClaims returns which of the given slots are held (their claim queue
// has a consumer, or is quarantined). Looking up a slot whose claim queue
// is missing costs a channel (the broker closes it with 404), so callers
// pass only the slots they could not account for otherwise.
func (s *Semaphore) readClaims(ctx context.Context, slots []int) ([]int, error) {
	var held []int
	var ch *channel
	defer func() {
		if ch != nil {
			_ = ch.Close()
		}
	}()
	for _, i := range slots {
		if ch == nil || ch.IsClosed() {
			var err error
			if ch, _, err = s.c.channel(ctx); err != nil {
				return nil, err
			}
		}
		var q amqp.Queue
		err := s.c.rpc(ctx, ch, func() (err error) {
			q, err = ch.QueueDeclarePassive(claimQueue(s.name, i), false, false, false, false, nil)
			return err
		}, nil)
		switch {
		case err == nil:
			if q.Consumers > 0 {
				held = append(held, i)
			}
		case isCode(err, amqp.ResourceLocked):
			// Its claim queue is quarantined by another connection (see
			// claim.go): a claimer waits for the slot.
			held = append(held, i)
		case isCode(err, amqp.NotFound): // its claim queue went away
		default:
			return nil, wrapBrokerErr("census of claims", err)
		}
	}
	return held, nil
}

// fullClaimCensus is the largest semaphore whose census looks up every
// slot's claim queue; larger ones look up only the slots with no ready
// token (a held or missing slot), so a ready copy of a held slot waits for
// its holder's release to be found.
const fullClaimCensus = 128

// unaccounted returns the slots whose claim queue the census looks up: all
// of them for small semaphores, else those in [0, permits) with no valid
// ready token, each either held or missing, which only its claim queue can
// tell.
func unaccounted(valid []bool, cfg config) []int {
	if cfg.Permits <= fullClaimCensus {
		return allSlots(cfg.Permits)
	}
	var out []int
	for i, ok := range valid {
		if !ok {
			out = append(out, i)
		}
	}
	return out
}

// Count reads the token queue's counters with a passive declare (one round
// trip): ready messages are available; the rest of the permits are held;
// consumers are waiters (a quorum queue also counts every holder as a
// consumer, which is taken off). See tokensem.Count for what it cannot
// tell.
//
// Errors: tokensem.ErrClosed, tokensem.ErrNotInitialized, or a wrapped
// broker error.
func (s *Semaphore) Count(ctx context.Context) (tokensem.Count, error) {
	if s.isClosed() {
		return tokensem.Count{}, tokensem.ErrClosed
	}
	ch, _, err := s.c.channel(ctx)
	if err != nil {
		return tokensem.Count{}, err
	}
	defer ch.Close()
	var q amqp.Queue
	rctx, cancel := s.rtt(ctx)
	defer cancel()
	err = s.c.rpc(rctx, ch, func() (err error) {
		q, err = ch.QueueDeclarePassive(tokenQueue(s.name), true, false, false, false, nil)
		return err
	}, nil)
	switch {
	case isCode(err, amqp.NotFound):
		return tokensem.Count{}, fmt.Errorf("%w: token queue %s is gone", tokensem.ErrNotInitialized, tokenQueue(s.name))
	case err != nil:
		return tokensem.Count{}, wrapBrokerErr("count", err)
	}
	cfg := s.config()
	c := tokensem.Count{Permits: cfg.Permits, Available: q.Messages, Held: max(0, cfg.Permits-q.Messages), Waiting: q.Consumers}
	if cfg.QueueType == Quorum {
		c.Waiting = max(0, c.Waiting-c.Held)
	}
	return c, nil
}

// allSlots returns the slot indices 0 to permits-1.
func allSlots(permits int) []int {
	all := make([]int, permits)
	for i := range all {
		all[i] = i
	}
	return all
}

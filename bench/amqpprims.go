package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// AMQPPrimitives are the broker operations an amqpsem cycle and handoff
// are made of, timed with plain amqp091 on a quorum queue of one message:
// the floor no client of the same protocol can go below.
type AMQPPrimitives struct {
	GetRequeue Summary // requeue of the held message + basic.get of it
	Push       Summary // requeue by its holder until a consumer on another channel has it
	Claim      Summary // exclusive consume + cancel on a classic queue (a claim and its end)
	// Join is a waiter joining the quorum queue: basic.consume until its
	// consume-ok, the message held on another channel. A NATS waiter's
	// pull needs no answer; an amqpsem waiter is served only once joined.
	Join Summary
	// Protocol is amqpsem's cycle played bare: consume the token queue
	// until the delivery, claim, cancel the consumer; cancel the claim,
	// requeue, confirming round trip (basic.qos). The library's share of
	// its cycle is what it takes beyond this.
	Protocol Summary
	// ProtocolHandoff is amqpsem's handoff played bare: from the holder's
	// claim cancel and requeue to a waiter consuming on another channel
	// (idle for 1 ms) holding the token, its claim made and its consumer
	// cancelled.
	ProtocolHandoff Summary
}

// protocol returns p, or none when p is nil.
func (p *AMQPPrimitives) protocol() AMQPPrimitives {
	if p == nil {
		return AMQPPrimitives{}
	}
	return *p
}

// CycleFloor is one client's acquire+release done with the fewest
// primitives: take the ready token, claim its slot, end the claim, requeue.
func (p AMQPPrimitives) CycleFloor() time.Duration { return p.GetRequeue.P50 + p.Claim.P50 }

// HandoffFloor is a release to a waiting consumer: the requeue's push, and
// the receiver's claim (an exclusive consume; the releaser's cancel of its
// own claim comes before the requeue).
func (p AMQPPrimitives) HandoffFloor() time.Duration { return p.Push.P50 + p.Claim.P50 }

// primitives times the AMQP primitives, samples of each after a tenth as
// many unrecorded ones.
func (a *amqpSystem) primitives(ctx context.Context, samples int) (AMQPPrimitives, error) {
	conn, err := amqp.Dial(a.url)
	if err != nil {
		return AMQPPrimitives{}, err
	}
	defer conn.Close()
	chA, err := conn.Channel()
	if err != nil {
		return AMQPPrimitives{}, err
	}
	chB, err := conn.Channel()
	if err != nil {
		return AMQPPrimitives{}, err
	}
	const q, claim = "bench.prim.tokens", "bench.prim.claim"
	if _, err := chA.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		return AMQPPrimitives{}, err
	}
	defer func() { _, _ = chA.QueueDelete(q, false, false, false) }()
	if _, err := chA.QueueDeclare(claim, false, false, false, false, nil); err != nil {
		return AMQPPrimitives{}, err
	}
	defer func() { _, _ = chA.QueueDelete(claim, false, false, false) }()
	if _, err := chA.QueuePurge(q, false); err != nil {
		return AMQPPrimitives{}, err
	}
	if err := chA.Confirm(false); err != nil {
		return AMQPPrimitives{}, err
	}
	if err := publishConfirmed(ctx, chA, q, []byte("t")); err != nil {
		return AMQPPrimitives{}, fmt.Errorf("primitives: %w", err)
	}
	warm := samples / 10
	var p AMQPPrimitives

	// basic.get, then requeue + basic.get: the requeue is one-way, and the
	// channel's next command waits behind it.
	var d []time.Duration
	held, ok, err := chA.Get(q, false)
	if err != nil || !ok {
		return AMQPPrimitives{}, fmt.Errorf("primitives: get: ok %v, %v", ok, err)
	}
	for i := range samples + warm {
		t0 := time.Now()
		if err := held.Nack(false, true); err != nil {
			return AMQPPrimitives{}, err
		}
		// A quorum queue applies the requeue through its log, so on a busy
		// machine the next get can come before it and find the queue
		// empty: ask again (a cost of the requeue, timed with it).
		for {
			if held, ok, err = chA.Get(q, false); err != nil {
				return AMQPPrimitives{}, fmt.Errorf("primitives: get after requeue: %w", err)
			}
			if ok {
				break
			}
			if time.Since(t0) > 5*time.Second {
				return AMQPPrimitives{}, errors.New("primitives: get after requeue: the queue stayed empty for 5 s")
			}
		}
		if i >= warm {
			d = append(d, time.Since(t0))
		}
	}
	p.GetRequeue = Summarize(d)

	// Exclusive consume + cancel on the claim queue.
	d = d[:0]
	for i := range samples + warm {
		t0 := time.Now()
		if _, err := chB.Consume(claim, "claim", false, true, false, false, nil); err != nil {
			return AMQPPrimitives{}, err
		}
		if err := chB.Cancel("claim", false); err != nil {
			return AMQPPrimitives{}, err
		}
		if i >= warm {
			d = append(d, time.Since(t0))
		}
	}
	p.Claim = Summarize(d)

	// Push: A holds the message (basic.get), B consumes; A's requeue goes
	// to B. B then cancels its consumer and requeues, and A gets it back.
	if err := chB.Qos(1, 0, false); err != nil {
		return AMQPPrimitives{}, err
	}
	d = d[:0]
	var joins []time.Duration
	for i := range samples + warm {
		j0 := time.Now()
		deliveries, err := chB.Consume(q, "waiter", false, false, false, false, nil)
		if err != nil {
			return AMQPPrimitives{}, err
		}
		if i >= warm {
			joins = append(joins, time.Since(j0))
		}
		t0 := time.Now()
		if err := held.Nack(false, true); err != nil {
			return AMQPPrimitives{}, err
		}
		var got amqp.Delivery
		select {
		case got = <-deliveries:
		case <-time.After(5 * time.Second):
			return AMQPPrimitives{}, fmt.Errorf("primitives: no push within 5s")
		case <-ctx.Done():
			return AMQPPrimitives{}, ctx.Err()
		}
		if i >= warm {
			d = append(d, time.Since(t0))
		}
		if err := chB.Cancel("waiter", false); err != nil {
			return AMQPPrimitives{}, err
		}
		if err := got.Nack(false, true); err != nil {
			return AMQPPrimitives{}, err
		}
		if held, ok, err = chA.Get(q, false); err != nil || !ok {
			// The requeue may not have landed yet: B's channel and A's are
			// not ordered.
			for tries := 0; err == nil && !ok && tries < 100; tries++ {
				time.Sleep(time.Millisecond)
				held, ok, err = chA.Get(q, false)
			}
			if err != nil || !ok {
				return AMQPPrimitives{}, fmt.Errorf("primitives: get back after the push: ok %v, %v", ok, err)
			}
		}
	}
	p.Push = Summarize(d)
	p.Join = Summarize(joins)
	if err := held.Nack(false, true); err != nil {
		return AMQPPrimitives{}, err
	}
	if p.Protocol, err = protocolCycle(ctx, chB, q, claim, samples, warm); err != nil {
		return AMQPPrimitives{}, fmt.Errorf("primitives: protocol cycle: %w", err)
	}
	if p.ProtocolHandoff, err = protocolHandoff(ctx, conn, q, claim, samples, warm); err != nil {
		return AMQPPrimitives{}, fmt.Errorf("primitives: protocol handoff: %w", err)
	}
	return p, nil
}

// protocolCycle times AMQPPrimitives.Protocol on ch (prefetch 1), the
// token ready in q.
func protocolCycle(ctx context.Context, ch *amqp.Channel, q, claim string, samples, warm int) (Summary, error) {
	var d []time.Duration
	for i := range samples + warm {
		t0 := time.Now()
		tok, err := takeAndClaim(ctx, ch, q, claim, "proto")
		if err != nil {
			return Summary{}, err
		}
		if err := giveBack(ch, tok); err != nil {
			return Summary{}, err
		}
		if i >= warm {
			d = append(d, time.Since(t0))
		}
	}
	return Summarize(d), nil
}

// protocolHandoff times AMQPPrimitives.ProtocolHandoff: a holder and a
// waiter on two channels of conn (prefetch 1), the token in q.
func protocolHandoff(ctx context.Context, conn *amqp.Connection, q, claim string, samples, warm int) (Summary, error) {
	var chs [2]*amqp.Channel
	for i := range chs {
		ch, err := conn.Channel()
		if err != nil {
			return Summary{}, err
		}
		defer ch.Close()
		if err := ch.Qos(1, 0, false); err != nil {
			return Summary{}, err
		}
		chs[i] = ch
	}
	holder, waiter := chs[0], chs[1]
	var d []time.Duration
	for i := range samples + warm {
		held, err := takeAndClaim(ctx, holder, q, claim, "holder")
		if err != nil {
			return Summary{}, err
		}
		type got struct {
			tok amqp.Delivery
			at  time.Time
			err error
		}
		gc := make(chan got, 1)
		deliveries, err := waiter.Consume(q, "waiter", false, false, false, false, nil)
		if err != nil {
			return Summary{}, err
		}
		go func() {
			tok, err := claimDelivery(ctx, waiter, deliveries, claim, "waiter")
			gc <- got{tok, time.Now(), err}
		}()
		time.Sleep(time.Millisecond) // the waiter goes idle, as in the handoff scenario
		t0 := time.Now()
		if err := giveBack(holder, held); err != nil {
			return Summary{}, err
		}
		g := <-gc
		if g.err != nil {
			return Summary{}, g.err
		}
		if i >= warm {
			d = append(d, g.at.Sub(t0))
		}
		if err := giveBack(waiter, g.tok); err != nil {
			return Summary{}, err
		}
	}
	return Summarize(d), nil
}

// takeAndClaim consumes q on ch until a delivery, and claims it (see
// claimDelivery).
func takeAndClaim(ctx context.Context, ch *amqp.Channel, q, claim, tag string) (amqp.Delivery, error) {
	deliveries, err := ch.Consume(q, tag, false, false, false, false, nil)
	if err != nil {
		return amqp.Delivery{}, err
	}
	return claimDelivery(ctx, ch, deliveries, claim, tag)
}

// claimDelivery waits for the consumer tag's delivery, claims the claim
// queue with an exclusive consumer and cancels the consumer (one-way), as
// amqpsem's Acquire does.
func claimDelivery(ctx context.Context, ch *amqp.Channel, deliveries <-chan amqp.Delivery, claim, tag string) (amqp.Delivery, error) {
	var tok amqp.Delivery
	select {
	case tok = <-deliveries:
	case <-time.After(5 * time.Second):
		return amqp.Delivery{}, errors.New("no delivery within 5 s")
	case <-ctx.Done():
		return amqp.Delivery{}, ctx.Err()
	}
	if _, err := ch.Consume(claim, "claim", false, true, false, false, nil); err != nil {
		return amqp.Delivery{}, err
	}
	return tok, ch.Cancel(tag, true)
}

// giveBack ends the claim and requeues tok (both one-way), then confirms
// with a round trip, as amqpsem's Release does.
func giveBack(ch *amqp.Channel, tok amqp.Delivery) error {
	if err := ch.Cancel("claim", true); err != nil {
		return err
	}
	if err := tok.Reject(true); err != nil {
		return err
	}
	return ch.Qos(1, 0, false)
}

// AMQPProtocolContention is the contention scenario played with plain
// amqp091 and the broker operations of amqpsem's protocol, without the
// library: each worker consumes the token queue (prefetch 1), claims the
// delivered token's slot with an exclusive consumer on a claim queue,
// cancels its consumer of the token queue, holds, then cancels its claim,
// requeues the token and confirms both with a round trip (basic.qos). What
// it reaches is the broker's limit for that protocol on this machine.
type AMQPProtocolContention struct {
	Workers, N   int
	Acquisitions int
	Throughput   float64 // acquisitions per second
	Ceiling      float64 // N / hold
	MeanHold     time.Duration
}

// Percent is the throughput as a share of the ceiling.
func (c *AMQPProtocolContention) Percent() float64 { return 100 * c.Throughput / c.Ceiling }

// protocolContention runs AMQPProtocolContention for dur after a second
// of warm-up, each worker on a connection of its own.
func (a *amqpSystem) protocolContention(ctx context.Context, workers, n int, hold, dur time.Duration, precise bool) (*AMQPProtocolContention, error) {
	admin, err := amqp.Dial(a.url)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	ch, err := admin.Channel()
	if err != nil {
		return nil, err
	}
	const q = "bench.proto.tokens"
	claim := func(i int) string { return fmt.Sprintf("bench.proto.claim.%d", i) }
	_, _ = ch.QueueDelete(q, false, false, false)
	if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		return nil, err
	}
	defer func() { _, _ = ch.QueueDelete(q, false, false, false) }()
	if err := ch.Confirm(false); err != nil {
		return nil, err
	}
	for i := range n {
		if _, err := ch.QueueDeclare(claim(i), false, false, false, false, nil); err != nil {
			return nil, err
		}
		defer func() { _, _ = ch.QueueDelete(claim(i), false, false, false) }()
		if err := publishConfirmed(ctx, ch, q, []byte{byte(i)}); err != nil {
			return nil, fmt.Errorf("protocol contention: %w", err)
		}
	}

	var (
		counting atomic.Bool
		stop     = make(chan struct{})
		mu       sync.Mutex
		count    int
		holds    time.Duration
		errs     []error
		wg       sync.WaitGroup
	)
	for w := range workers {
		conn, err := amqp.Dial(a.url)
		if err != nil {
			close(stop)
			wg.Wait()
			return nil, err
		}
		defer conn.Close()
		wg.Go(func() {
			if err := protocolWorker(conn, q, claim, fmt.Sprintf("w%d", w), hold, precise, stop, func(held time.Duration) {
				if counting.Load() {
					mu.Lock()
					count++
					holds += held
					mu.Unlock()
				}
			}); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	select {
	case <-time.After(time.Second):
	case <-ctx.Done():
	}
	counting.Store(true)
	select {
	case <-time.After(dur):
	case <-ctx.Done():
	}
	counting.Store(false)
	close(stop)
	wg.Wait()
	if err := joinDistinct(errs); err != nil {
		return nil, err
	}
	r := &AMQPProtocolContention{Workers: workers, N: n, Acquisitions: count, Throughput: float64(count) / dur.Seconds(),
		Ceiling: float64(n) / hold.Seconds()}
	if count > 0 {
		r.MeanHold = holds / time.Duration(count)
	}
	return r, ctx.Err()
}

// protocolWorker is one worker of protocolContention: it reports each
// hold (acquisitions that end after stop closes are not reported).
func protocolWorker(conn *amqp.Connection, q string, claim func(int) string, tag string, hold time.Duration, precise bool,
	stop <-chan struct{}, held func(time.Duration)) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Qos(1, 0, false); err != nil {
		return err
	}
	for {
		deliveries, err := ch.Consume(q, tag, false, false, false, false, nil)
		if err != nil {
			return err
		}
		var d amqp.Delivery
		select {
		case d = <-deliveries:
		case <-stop:
			return nil // closing the connection requeues anything on its way
		}
		if len(d.Body) != 1 {
			return fmt.Errorf("protocol contention: token %q", d.Body)
		}
		if _, err := ch.Consume(claim(int(d.Body[0])), "claim", false, true, false, false, nil); err != nil {
			return err
		}
		if err := ch.Cancel(tag, true); err != nil {
			return err
		}
		t0 := time.Now()
		holdFor(hold, precise)
		h := time.Since(t0)
		if err := ch.Cancel("claim", true); err != nil {
			return err
		}
		if err := d.Reject(true); err != nil {
			return err
		}
		if err := ch.Qos(1, 0, false); err != nil {
			return err
		}
		select {
		case <-stop:
			return nil
		default:
			held(h)
		}
	}
}

// publishConfirmed publishes a persistent message to queue q on ch (in
// confirm mode) and waits for the broker's confirmation.
func publishConfirmed(ctx context.Context, ch *amqp.Channel, q string, body []byte) error {
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, true, false, amqp.Publishing{DeliveryMode: amqp.Persistent, Body: body})
	if err != nil {
		return err
	}
	if ok, err := dc.WaitContext(ctx); !ok || err != nil {
		return fmt.Errorf("publish confirmed %v: %v", ok, err)
	}
	return nil
}

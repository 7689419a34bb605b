package main

import (
	"context"
	"fmt"
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
	dc, err := chA.PublishWithDeferredConfirmWithContext(ctx, "", q, true, false, amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte("t")})
	if err != nil {
		return AMQPPrimitives{}, err
	}
	if ok, err := dc.WaitContext(ctx); !ok || err != nil {
		return AMQPPrimitives{}, fmt.Errorf("primitives: publish confirmed %v: %v", ok, err)
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
		if held, ok, err = chA.Get(q, false); err != nil || !ok {
			return AMQPPrimitives{}, fmt.Errorf("primitives: get after requeue: ok %v, %v", ok, err)
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
	for i := range samples + warm {
		deliveries, err := chB.Consume(q, "waiter", false, false, false, false, nil)
		if err != nil {
			return AMQPPrimitives{}, err
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
	return p, nil
}

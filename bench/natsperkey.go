package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// PerKeyFloor is what per-key semaphores cost JetStream itself, measured
// with plain nats.go beside the sems scenario: count keys laid out as a
// natssem group's (one stream with limits retention, a consumer filtered
// on each key's subject, one KV bucket with a record per key), with
// nothing of natssem's around them.
type PerKeyFloor struct {
	Count int
	// Create is one key: its consumer, its tokens (published
	// asynchronously, all acknowledged) and its record; 4 at a time, as the
	// scenario's Inits.
	Create Summary
	// Lone is one key's cycle over and over: a one-message pull, two
	// compare-and-sets of its record and a Nak (the primitives of a fenced
	// cycle); Cycle is the same cycle taken once on each key in turn, the
	// second such round, as the scenario's.
	Lone, Cycle Summary
}

// Ratio is the round's cycle over the lone one's: what JetStream's own
// per-key state costs a cycle once count keys take turns.
func (f PerKeyFloor) Ratio() float64 { return float64(f.Cycle.P50) / float64(f.Lone.P50) }

const (
	perKeyStream = "BENCH_PERKEY"
	perKeyBucket = "bench_perkey"
)

// perKeyFloor lays out count keys of n tokens as above, times their
// creation and cycles, and removes them.
func (n *natsSystem) perKeyFloor(ctx context.Context, count, permits, lone, conc int) (*PerKeyFloor, error) {
	js := n.js
	cleanup := func() {
		cctx := context.WithoutCancel(ctx)
		_ = js.DeleteStream(cctx, perKeyStream)
		_ = js.DeleteKeyValue(cctx, perKeyBucket)
	}
	cleanup()
	defer cleanup()
	replicas := max(n.replicas, 1)
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: perKeyStream, Subjects: []string{"perkey.*.tok"},
		Storage: jetstream.FileStorage, Replicas: replicas, MaxConsumers: count + 1})
	if err != nil {
		return nil, err
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: perKeyBucket, History: 1,
		Storage: jetstream.FileStorage, Replicas: replicas})
	if err != nil {
		return nil, err
	}
	cons := make([]jetstream.Consumer, count)
	revs := make([]uint64, count)
	creates := make([]time.Duration, count)
	err = parallel(conc, count, func(i int) error {
		k := "k" + strconv.Itoa(i)
		subject := "perkey." + k + ".tok"
		t := time.Now()
		c, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: k, FilterSubject: subject,
			AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute, Replicas: replicas})
		if err != nil {
			return fmt.Errorf("consumer %s: %w", k, err)
		}
		acks := make([]jetstream.PubAckFuture, permits)
		for j := range acks {
			if acks[j], err = js.PublishAsync(subject, []byte("token")); err != nil {
				return err
			}
		}
		for _, f := range acks {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				return err
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if revs[i], err = kv.Create(ctx, k, []byte("free")); err != nil {
			return fmt.Errorf("record %s: %w", k, err)
		}
		creates[i] = time.Since(t)
		cons[i] = c
		return nil
	})
	if err != nil {
		return nil, err
	}
	cycle := func(i int) (time.Duration, error) {
		k := "k" + strconv.Itoa(i)
		t := time.Now()
		m, err := fetchOne(cons[i])
		if err != nil {
			return 0, fmt.Errorf("per-key floor: %s: %w", k, err)
		}
		if revs[i], err = kv.Update(ctx, k, []byte("held"), revs[i]); err != nil {
			return 0, err
		}
		if revs[i], err = kv.Update(ctx, k, []byte("free"), revs[i]); err != nil {
			return 0, err
		}
		if err := m.Nak(); err != nil {
			return 0, err
		}
		return time.Since(t), nil
	}
	var lones []time.Duration
	for j := range lone + lone/10 {
		d, err := cycle(0)
		if err != nil {
			return nil, err
		}
		if j >= lone/10 { // the first tenth warms up
			lones = append(lones, d)
		}
	}
	var round []time.Duration
	for r := range 2 {
		round = round[:0]
		for i := range count {
			d, err := cycle(i)
			if err != nil {
				return nil, fmt.Errorf("round %d: %w", r, err)
			}
			round = append(round, d)
		}
	}
	return &PerKeyFloor{Count: count, Create: Summarize(creates), Lone: Summarize(lones), Cycle: Summarize(round)}, nil
}

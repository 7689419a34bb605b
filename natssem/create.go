package natssem

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/backoff"
)

// Creating a semaphore (Init): the stream, its consumer and the KV bucket
// first (idempotent), then the configuration, created once by compare-and-
// set; its creator (the seeder) publishes the tokens, resumably, and marks
// it ready, while the other Inits wait for that.

// createResources creates (or finds) the token stream, its holders
// consumer and the KV bucket.
func (s *Semaphore) createResources(ctx context.Context, permits int) error {
	rctx, cancel := s.rtt(ctx)
	defer cancel()
	stream, err := s.js.CreateStream(rctx, jetstream.StreamConfig{
		Name:        StreamName(s.name),
		Description: "tokensem tokens of " + s.name,
		Subjects:    []string{Subject(s.name)},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    s.opts.replicas,
		Discard:     jetstream.DiscardOld,
		Duplicates:  2 * time.Minute,
		AllowDirect: true,
	})
	switch {
	case errors.Is(err, jetstream.ErrStreamNameAlreadyInUse):
		stream, err = s.js.Stream(rctx, StreamName(s.name))
		if err != nil {
			return wrapBrokerErr(err)
		}
	case err != nil:
		return wrapBrokerErr(err)
	}
	s.stream = stream
	lease := s.opts.Lease
	if _, err := stream.CreateConsumer(rctx, jetstream.ConsumerConfig{
		Durable:       consumerName,
		Description:   "tokensem holders of " + s.name,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       lease,
		MaxDeliver:    -1,
		MaxWaiting:    s.opts.maxWaiters,
		MaxAckPending: -1,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}); err != nil && !errors.Is(err, jetstream.ErrConsumerExists) {
		return wrapBrokerErr(err)
	}
	kv, err := s.js.CreateKeyValue(rctx, jetstream.KeyValueConfig{
		Bucket:      BucketName(s.name),
		Description: "tokensem config and slot leases of " + s.name,
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    s.opts.replicas,
	})
	if errors.Is(err, jetstream.ErrBucketExists) {
		kv, err = s.js.KeyValue(rctx, BucketName(s.name))
	}
	if err != nil {
		return wrapBrokerErr(err)
	}
	s.setBucket(kv)
	return nil
}

// errRecreate sends Init back to createResources: the configuration it
// was creating went away or changed hands, and is read afresh.
var errRecreate = errors.New("natssem: the semaphore changed while being created")

// seedStallTimeout is how long a creator may take to publish the tokens
// before another Init takes the job over. It is well inside the stream's
// 2-minute duplicate window, so a takeover republishing the same message IDs
// cannot create duplicates.
const seedStallTimeout = 30 * time.Second

// createConfig makes sure the configuration exists and the tokens are
// published exactly once, whoever else runs Init at the same time.
func (s *Semaphore) createConfig(ctx context.Context, permits int) (config, error) {
	me := s.seeder
	want := config{
		Version: configVersion, Permits: permits, Lease: s.opts.Lease, Epoch: 1,
		KeyCheck: s.codec.KeyCheck(), State: stateSeeding, Seeder: me,
		Created: time.Now().UnixMilli(),
	}
	for {
		rctx, cancel := s.rtt(ctx)
		rev, err := s.kv.Create(rctx, configKey, want.encode())
		cancel()
		if err == nil {
			return s.seed(ctx, want, rev)
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return config{}, wrapBrokerErr(err)
		}
		cfg, rev, err := s.readConfig(ctx)
		if errors.Is(err, tokensem.ErrNotInitialized) {
			continue // deleted since (a Delete that found no holder): create it again
		}
		if err != nil {
			return config{}, err
		}
		if cfg.State == stateDeleting {
			if err := s.awaitDelete(ctx); err != nil {
				return config{}, err
			}
			return config{}, errRecreate
		}
		if cfg.Permits != permits {
			return config{}, &tokensem.PermitMismatchError{Name: s.name, Have: cfg.Permits, Want: permits}
		}
		if err := s.codec.CheckKey(s.name, cfg.KeyCheck); err != nil {
			return config{}, err
		}
		if cfg.State == stateReady {
			return cfg, nil
		}
		if cfg.Seeder == me {
			return s.seed(ctx, cfg, rev) // this Init's own seeding, interrupted: resume it
		}
		// Someone else is seeding: wait for them, or take over if they stalled.
		if time.Since(time.UnixMilli(cfg.Created)) > seedStallTimeout {
			cfg.Seeder, cfg.Created = me, time.Now().UnixMilli()
			rctx, cancel := s.rtt(ctx)
			rev, err = s.kv.Update(rctx, configKey, cfg.encode(), rev)
			cancel()
			if err == nil {
				s.log.Warn("took over a stalled token seeding")
				return s.seed(ctx, cfg, rev)
			}
			continue
		}
		select {
		case <-ctx.Done():
			return config{}, fmt.Errorf("natssem: waiting for another Init of %s: %w", s.name, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// seed publishes the tokens of cfg's epoch, deduplicated by message ID, then
// marks the configuration ready.
func (s *Semaphore) seed(ctx context.Context, cfg config, rev uint64) (config, error) {
	const batch = 1000
	for lo := 0; lo < cfg.Permits; lo += batch {
		var acks []jetstream.PubAckFuture
		for i := lo; i < min(lo+batch, cfg.Permits); i++ {
			b, err := s.codec.Encode(tokensem.NewToken(s.name, i, cfg.Epoch))
			if err != nil {
				return config{}, err
			}
			id := s.name + "." + strconv.FormatUint(cfg.Epoch, 10) + "." + strconv.Itoa(i)
			f, err := s.js.PublishAsync(Subject(s.name), b, jetstream.WithMsgID(id))
			if err != nil {
				return config{}, wrapBrokerErr(err)
			}
			acks = append(acks, f)
		}
		for _, f := range acks {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				return config{}, wrapBrokerErr(err)
			case <-ctx.Done():
				return config{}, ctx.Err()
			}
		}
	}
	cfg.State = stateReady
	rctx, cancel := s.rtt(ctx)
	defer cancel()
	if _, err := s.kv.Update(rctx, configKey, cfg.encode(), rev); err != nil {
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			// Another Init took the seeding over (this one stalled past
			// seedStallTimeout), or a Delete marked the configuration.
			return config{}, errRecreate
		}
		return config{}, wrapBrokerErr(err)
	}
	s.awaitTokens(ctx, cfg.Permits)
	s.log.Info("semaphore created", "permits", cfg.Permits, "lease", cfg.Lease)
	return cfg, nil
}

// awaitTokens waits (briefly, best effort) until the consumer counts the
// tokens just published. The server tells consumers of new messages
// asynchronously, and until it has, a no-wait pull finds nothing: measured
// 2 times in 300, TryAcquire right after Init returned ErrNoPermit.
func (s *Semaphore) awaitTokens(ctx context.Context, permits int) {
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		info, err := s.consumerInfo(ctx)
		if err != nil || info.NumPending+uint64(info.NumAckPending) >= uint64(permits) {
			return
		}
		if backoff.Sleep(ctx, 2*time.Millisecond) != nil {
			return
		}
	}
}

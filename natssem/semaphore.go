package natssem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/backoff"
	"github.com/tokensem/tokensem/internal/cfgcache"
	"github.com/tokensem/tokensem/internal/ids"
	"github.com/tokensem/tokensem/reconciler"
)

var _ tokensem.Semaphore = (*Semaphore)(nil)

// Resource names of a semaphore called name.
const (
	streamPrefix = "TOKENSEM_" // token stream: TOKENSEM_<name>
	bucketPrefix = "tokensem_" // KV bucket:   tokensem_<name>
	consumerName = "holders"
)

// StreamName returns the name of the token stream of semaphore name.
func StreamName(name string) string { return streamPrefix + name }

// BucketName returns the name of the KV bucket of semaphore name.
func BucketName(name string) string { return bucketPrefix + name }

// Subject returns the subject the tokens of semaphore name are published on.
func Subject(name string) string { return "tokensem." + name + ".tokens" }

// Semaphore is a distributed semaphore whose permits are token messages in
// a JetStream work-queue stream. Create one with Init or Open; it is safe for
// concurrent use.
type Semaphore struct {
	nc       *nats.Conn
	js       jetstream.JetStream
	kv       jetstream.KeyValue
	stream   jetstream.Stream
	name     string
	opts     options
	codec    tokensem.Codec
	log      *slog.Logger
	pullSubj string
	seeder   string // this client's id as the creator of a semaphore (Init)
	waitPull []byte // body of a waiting pull request
	returned *handbacks
	slots    *slotStore    // set once the bucket is found
	lockTTL  time.Duration // see lock

	cfg cfgcache.Cache[config] // as last read; see freshConfig

	mu     sync.Mutex
	idle   []*waiter // inboxes with no pull pending, for reuse
	closed bool
	done   chan struct{} // closed by Close: wakes waiting Acquire calls
}

// Init creates semaphore name with permits tokens, or opens it if it already
// exists with the same number of permits. It is idempotent and safe to run
// from many processes at once: exactly one of them publishes the tokens, the
// others wait for it (bounded by ctx). A broker that does not answer for a
// while (a cluster electing leaders or placing the new replicas) is
// retried until ctx ends.
//
// Errors: tokensem.ErrInvalidName, tokensem.ErrInvalidPermits,
// tokensem.ErrInvalidOption, tokensem.ErrPermitMismatch (exists with another
// count), tokensem.ErrLeaseMismatch (exists with another lease than the one
// WithLease asked for; without WithLease the stored lease is used),
// tokensem.ErrKeyMismatch, or a wrapped broker error.
func Init(ctx context.Context, nc *nats.Conn, name string, permits int, opts ...Option) (*Semaphore, error) {
	if err := tokensem.ValidateName(name); err != nil {
		return nil, err
	}
	if err := tokensem.ValidatePermits(permits); err != nil {
		return nil, err
	}
	o, err := newOptions(opts)
	if err != nil {
		return nil, err
	}
	if err := o.checkRequestTimeout(o.Lease); err != nil {
		return nil, err
	}
	s, err := newSemaphore(nc, name, o)
	if err != nil {
		return nil, err
	}
	var cfg config
	err = s.retry(ctx, "init", func() error {
		if err := s.createResources(ctx, permits); err != nil {
			return err
		}
		cfg, err = s.createConfig(ctx, permits)
		return err
	})
	if err != nil {
		return nil, err
	}
	if cfg.Lease != o.Lease && o.leaseSet {
		return nil, fmt.Errorf("%w: %s has a lease of %v, not %v (the lease is set when the semaphore is created)",
			tokensem.ErrLeaseMismatch, name, cfg.Lease, o.Lease)
	}
	if err := s.useLease(cfg.Lease); err != nil {
		return nil, err
	}
	s.setConfig(cfg)
	return s, nil
}

// Open opens an existing semaphore; only its name is needed, the rest is read
// from the broker. A broker that does not answer for a while is retried
// until ctx ends.
//
// Errors: tokensem.ErrInvalidName, tokensem.ErrInvalidOption,
// tokensem.ErrNotInitialized (no such semaphore, or Init has not finished),
// tokensem.ErrKeyMismatch, or a wrapped broker error.
func Open(ctx context.Context, nc *nats.Conn, name string, opts ...Option) (*Semaphore, error) {
	if err := tokensem.ValidateName(name); err != nil {
		return nil, err
	}
	o, err := newOptions(opts)
	if err != nil {
		return nil, err
	}
	s, err := newSemaphore(nc, name, o)
	if err != nil {
		return nil, err
	}
	var (
		cfg  config
		cons *jetstream.ConsumerInfo
	)
	err = s.retry(ctx, "open", func() error {
		if err := s.bind(ctx); err != nil {
			return err
		}
		if cfg, _, err = s.readConfig(ctx); err != nil || cfg.State != stateReady {
			return err
		}
		cons, err = s.consumerInfo(ctx)
		return err
	})
	if err != nil {
		return nil, err
	}
	if cfg.State != stateReady {
		return nil, fmt.Errorf("%w: %s is still being created", tokensem.ErrNotInitialized, name)
	}
	if w := ackWaitWarning(cons.Config.AckWait, cfg.Lease); w != "" {
		s.log.Warn(w)
	}
	if err := s.codec.CheckKey(s.name, cfg.KeyCheck); err != nil {
		return nil, err
	}
	if err := s.useLease(cfg.Lease); err != nil {
		return nil, err
	}
	s.setConfig(cfg)
	return s, nil
}

// useLease fits the request timeout to the semaphore's stored lease: a
// timeout set by WithRequestTimeout must be shorter than
// maxRequestTimeout(lease); an unset one becomes defaultRequestTimeout.
func (s *Semaphore) useLease(lease time.Duration) error {
	if err := s.opts.checkRequestTimeout(lease); err != nil {
		return err
	}
	if !s.opts.timeoutSet {
		s.opts.RequestTimeout = defaultRequestTimeout(s.opts.RequestTimeout, lease)
	}
	s.slots.timeout = s.opts.RequestTimeout
	return nil
}

// retry runs step until it succeeds, fails for good, or ctx ends: a broker
// that does not answer for a while (a stream electing a leader, a cluster
// placing new replicas) is waited out. Init, Open and a census are
// idempotent.
func (s *Semaphore) retry(ctx context.Context, what string, step func() error) error {
	return backoff.Retry(ctx, backoff.Backoff{Min: 50 * time.Millisecond, Max: time.Second}, s.done, transient,
		func(err error) { s.log.Warn(what+": the broker did not answer; retrying", "err", err) }, step)
}

func newSemaphore(nc *nats.Conn, name string, o options) (*Semaphore, error) {
	if nc == nil {
		return nil, fmt.Errorf("%w: nil NATS connection", tokensem.ErrInvalidOption)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("natssem: %w", err)
	}
	return &Semaphore{
		nc:       nc,
		js:       js,
		name:     name,
		opts:     o,
		codec:    tokensem.NewCodec(o.Key),
		log:      o.Logger.With("semaphore", name),
		pullSubj: "$JS.API.CONSUMER.MSG.NEXT." + StreamName(name) + "." + consumerName,
		seeder:   ids.New(),
		returned: newHandbacks(nc),
		waitPull: mustMarshal(pullRequest{Batch: 1, Expires: o.pullExpiry, Heartbeat: o.heartbeat}),
		done:     make(chan struct{}),
		lockTTL:  defaultLockTTL,
	}, nil
}

// rtt returns a context bounded by the request timeout for one round trip.
func (s *Semaphore) rtt(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.opts.RequestTimeout)
}

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

func (s *Semaphore) setBucket(kv jetstream.KeyValue) {
	s.kv = kv
	s.slots = newSlotStore(kv, s.opts.RequestTimeout, s.log)
}

// bind finds the resources of an existing semaphore.
func (s *Semaphore) bind(ctx context.Context) error {
	rctx, cancel := s.rtt(ctx)
	defer cancel()
	kv, err := s.js.KeyValue(rctx, BucketName(s.name))
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return fmt.Errorf("%w: %s", tokensem.ErrNotInitialized, s.name)
	}
	if err != nil {
		return wrapBrokerErr(err)
	}
	stream, err := s.js.Stream(rctx, StreamName(s.name))
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("%w: %s has no token stream", tokensem.ErrNotInitialized, s.name)
	}
	if err != nil {
		return wrapBrokerErr(err)
	}
	s.stream = stream
	s.setBucket(kv)
	return nil
}

func (s *Semaphore) readConfig(ctx context.Context) (config, uint64, error) {
	rctx, cancel := s.rtt(ctx)
	defer cancel()
	e, err := s.kv.Get(rctx, configKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return config{}, 0, fmt.Errorf("%w: %s has no configuration", tokensem.ErrNotInitialized, s.name)
	}
	if err != nil {
		return config{}, 0, wrapBrokerErr(err)
	}
	cfg, err := decodeConfig(e.Value())
	return cfg, e.Revision(), err
}

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
		if err != nil {
			return config{}, err
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
			return config{}, fmt.Errorf("natssem: another Init took over creating %s (this one stalled past %v)", s.name, seedStallTimeout)
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

// Name returns the semaphore's name.
func (s *Semaphore) Name() string { return s.name }

// Permits returns the number of permits as last read from the broker.
func (s *Semaphore) Permits() int { return s.cfg.Get().Permits }

// Lease returns the semaphore's lease.
func (s *Semaphore) Lease() time.Duration { return s.cfg.Get().Lease }

func (s *Semaphore) config() config { return s.cfg.Get() }

// refreshConfig re-reads the configuration (it changes on resize).
func (s *Semaphore) refreshConfig(ctx context.Context) (config, error) {
	return s.cfg.Refresh(ctx, s.readCurrentConfig)
}

// readCurrentConfig is readConfig without the revision.
func (s *Semaphore) readCurrentConfig(ctx context.Context) (config, error) {
	cfg, _, err := s.readConfig(ctx)
	return cfg, err
}

func (s *Semaphore) setConfig(cfg config) { s.cfg.Set(cfg) }

// configTTL is how long an acquirer trusts the configuration it read: after
// a resize, every client admits by the new permit count within this long.
const configTTL = 2 * time.Second

// freshConfig returns the configuration, re-reading it when it is older
// than configTTL.
func (s *Semaphore) freshConfig(ctx context.Context) (config, error) {
	return s.cfg.Fresh(ctx, configTTL, s.readCurrentConfig)
}

// Resize changes the number of permits and repairs the token set to match
// (see reconciler.Run): growing issues tokens for the new slots; shrinking
// removes the ready tokens of slots >= permits, while their holders keep
// their permits until they release (their tokens are then retired by the
// next acquirer). Every client admits by the new count within configTTL,
// so admission never exceeds max(old, new) and converges to the new count.
//
// Errors: tokensem.ErrInvalidPermits, tokensem.ErrClosed, or a wrapped
// broker error.
func (s *Semaphore) Resize(ctx context.Context, permits int) (reconciler.Report, error) {
	if err := tokensem.ValidatePermits(permits); err != nil {
		return reconciler.Report{}, err
	}
	if s.isClosed() {
		return reconciler.Report{}, tokensem.ErrClosed
	}
	if err := s.writePermits(ctx, permits); err != nil {
		return reconciler.Report{}, err
	}
	return reconciler.Run(ctx, s.Inventory(), true)
}

// writePermits stores the new permit count under the admin lock, so that
// no reconcile run sees it change halfway through.
func (s *Semaphore) writePermits(ctx context.Context, permits int) error {
	unlock, err := s.lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	for {
		cfg, rev, err := s.readConfig(ctx)
		if err != nil {
			return err
		}
		if cfg.Permits == permits {
			return nil
		}
		old := cfg.Permits
		cfg.Permits = permits
		rctx, cancel := s.rtt(ctx)
		_, err = s.kv.Update(rctx, configKey, cfg.encode(), rev)
		cancel()
		switch {
		case errors.Is(err, jetstream.ErrKeyRevisionMismatch), errors.Is(err, jetstream.ErrKeyExists):
			continue // changed meanwhile (a client of an earlier version): read again
		case err != nil:
			return wrapBrokerErr(err)
		}
		s.setConfig(cfg)
		s.log.Info("resized", "from", old, "to", permits)
		return nil
	}
}

// Close makes later calls return tokensem.ErrClosed and wakes callers
// blocked in Acquire (they return ErrClosed). Held permits stay valid until
// released or lost. The NATS connection belongs to the caller and stays open.
func (s *Semaphore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		close(s.done)
		s.returned.close()
		for _, w := range s.idle {
			w.close()
		}
		s.idle = nil
	}
	return nil
}

func (s *Semaphore) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

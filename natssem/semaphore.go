package natssem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/driver"
	"github.com/tokensem/tokensem/internal/backoff"
	"github.com/tokensem/tokensem/internal/cfgcache"
	"github.com/tokensem/tokensem/internal/ids"
	"github.com/tokensem/tokensem/internal/weighted"
)

var (
	_ tokensem.Semaphore = (*Semaphore)(nil)
	_ tokensem.Counter   = (*Semaphore)(nil)
)

// Semaphore is a distributed semaphore whose permits are token messages in
// a JetStream work-queue stream. Create one with Init or Open; it is safe for
// concurrent use.
type Semaphore struct {
	nc       *nats.Conn
	js       jetstream.JetStream
	kv       jetstream.KeyValue
	stream   jetstream.Stream
	name     string
	lay      layout
	opts     options
	codec    driver.Codec
	log      *slog.Logger
	pullSubj string
	seeder   string // this client's id as the creator of a semaphore (Init)
	pulls    *pullBodies
	returned *handbacks
	rights   *watcher      // of the connection's permission refusals
	slots    *slotStore    // set once the bucket is found
	lockTTL  time.Duration // see lock
	// releaseWait bounds a claim's wait for a release it cannot see yet,
	// with the request timeout (awaitRelease).
	releaseWait time.Duration

	cfg   cfgcache.Cache[config] // as last read; see freshConfig
	group *groupShare            // of the group on this connection; nil alone

	gates weighted.Gate[*Semaphore] // see gate: made by the first AcquireN of k > 1

	waiting atomic.Int64 // callers in Acquire that wait (WithMaxLocalWaiters)

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
	return initSemaphore(ctx, nc, name, permits, o)
}

// initSemaphore is Init with a name and permit count already checked (or,
// for a gate, made by the library).
func initSemaphore(ctx context.Context, nc *nats.Conn, name string, permits int, o options) (*Semaphore, error) {
	if err := o.checkRequestTimeout(o.Lease); err != nil {
		return nil, err
	}
	s, err := newSemaphore(nc, name, o)
	if err != nil {
		return nil, err
	}
	var (
		cfg    config
		readAt time.Time // when the read of cfg began (or its write)
	)
	err = s.retry(ctx, "init", func() error {
		for {
			readAt = time.Now()
			if err := s.createResources(ctx, permits); err != nil {
				return err
			}
			cfg, err = s.createConfig(ctx, permits)
			if err != nil && s.group != nil {
				s.group.forget() // found again by the next try
			}
			if !errors.Is(err, errRecreate) {
				return err
			}
			if err := ctx.Err(); err != nil {
				return err
			}
		}
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
	at := time.Now()
	if up, ok := s.upgradeClasses(ctx, cfg); ok {
		cfg, readAt = up, at
	}
	s.cfg.SetAt(cfg, readAt)
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
	return openSemaphore(ctx, nc, name, o)
}

// openSemaphore is Open with a name already checked (or, for a gate, made
// by the library).
func openSemaphore(ctx context.Context, nc *nats.Conn, name string, o options) (*Semaphore, error) {
	s, err := newSemaphore(nc, name, o)
	if err != nil {
		return nil, err
	}
	var (
		cfg    config
		cons   *jetstream.ConsumerInfo
		readAt time.Time // when the read of cfg began
	)
	err = s.retry(ctx, "open", func() error {
		readAt = time.Now()
		if err := s.bind(ctx); err != nil {
			return err
		}
		// readCurrentConfig: a key of a group notes its group's generation.
		if cfg, err = s.readCurrentConfig(ctx); err != nil || cfg.State != stateReady {
			return err
		}
		cons, err = s.consumerInfo(ctx)
		return err
	})
	if err != nil {
		return nil, err
	}
	switch cfg.State {
	case stateReady:
	case stateDeleting:
		return nil, fmt.Errorf("%w: %s is being deleted", tokensem.ErrNotInitialized, name)
	default:
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
	s.cfg.SetAt(cfg, readAt)
	return s, nil
}

// useLease checks the request timeout against the semaphore's stored
// lease: one set by WithRequestTimeout must be shorter than
// maxRequestTimeout(lease) (an unset one follows the lease: see
// requestTimeout).
func (s *Semaphore) useLease(lease time.Duration) error {
	return s.opts.checkRequestTimeout(lease)
}

// requestTimeout bounds one round trip: WithRequestTimeout's, or
// defaultRequestTimeout for the lease of the configuration last read
// (another life of the name may have another lease).
func (s *Semaphore) requestTimeout() time.Duration {
	if s.opts.timeoutSet {
		return s.opts.RequestTimeout
	}
	lease := s.cfg.Get().Lease
	if lease == 0 {
		lease = s.opts.Lease // not read yet (Init, Open)
	}
	return defaultRequestTimeout(s.opts.RequestTimeout, lease)
}

// retry runs step until it succeeds, fails for good, or ctx ends: a broker
// that does not answer for a while (a stream electing a leader, a cluster
// placing new replicas) is waited out. Init, Open and a census are
// idempotent. A step that timed out while the broker refused one of the
// semaphore's subjects fails for good with that refusal.
func (s *Semaphore) retry(ctx context.Context, what string, step func() error) error {
	return backoff.Retry(ctx, backoff.Backoff{Min: 50 * time.Millisecond, Max: time.Second}, s.done, transient,
		func(err error) { s.log.Warn(what+": the broker did not answer; retrying", "err", err) },
		func() error {
			start := time.Now()
			err := step()
			if transient(err) {
				if perr := s.rights.refusedSince(start, s); perr != nil {
					return perr
				}
			}
			return err
		})
}

func newSemaphore(nc *nats.Conn, name string, o options) (*Semaphore, error) {
	if nc == nil {
		return nil, fmt.Errorf("%w: nil NATS connection", tokensem.ErrInvalidOption)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("natssem: %w", err)
	}
	lay := newLayout(o.group, name)
	log := o.Logger.With("semaphore", name)
	var group *groupShare
	if lay.grouped() {
		log = log.With("group", o.group)
		group = sharedGroup(nc, lay.bucket)
	}
	return &Semaphore{
		group:       group,
		nc:          nc,
		js:          js,
		name:        name,
		lay:         lay,
		opts:        o,
		codec:       driver.NewCodec(o.Key),
		log:         log,
		pullSubj:    "$JS.API.CONSUMER.MSG.NEXT." + lay.stream + "." + lay.consumer,
		seeder:      ids.New(),
		returned:    newHandbacks(nc),
		rights:      watch(nc),
		pulls:       newPullBodies(o.pullExpiry, o.heartbeat),
		done:        make(chan struct{}),
		lockTTL:     defaultLockTTL,
		releaseWait: maxReleaseWait,
	}, nil
}

// rtt returns a context bounded by the request timeout for one round trip,
// and ended at once, with an error wrapping tokensem.ErrPermissionDenied,
// when the broker refuses one of the semaphore's subjects (rights.go).
func (s *Semaphore) rtt(ctx context.Context) (context.Context, context.CancelFunc) {
	return s.rights.guard(ctx, s, s.requestTimeout())
}

func (s *Semaphore) setBucket(kv jetstream.KeyValue) {
	s.kv = kv
	s.slots = newSlotStore(kv, s.lay, s.requestTimeout, s.log)
}

// bind finds the resources of an existing semaphore.
func (s *Semaphore) bind(ctx context.Context) error {
	rctx, cancel := s.rtt(ctx)
	defer cancel()
	kv, err := s.js.KeyValue(rctx, s.lay.bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return fmt.Errorf("%w: %s", tokensem.ErrNotInitialized, s.name)
	}
	if err != nil {
		return wrapBrokerErr(err)
	}
	stream, err := s.js.Stream(rctx, s.lay.stream)
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

// errNoRecord is readLast's answer for a key never written, deleted or
// purged.
var errNoRecord = errors.New("natssem: no such record")

// readLast reads the bucket's record key (a full KV key) and its revision
// from the bucket's stream leader. kv.Get would be answered by any replica
// (a direct get), and a replica may not yet have applied a write
// acknowledged a moment ago: on a 3-node cluster a resize's census read the
// count it had just replaced (TestClusterResizeSeesItsWrite), and an Open
// through another node right after an Init found it still being created.
// The leader has applied every acknowledged write.
func (s *Semaphore) readLast(ctx context.Context, key string) ([]byte, uint64, error) {
	rctx, cancel := s.rtt(ctx)
	defer cancel()
	req := mustMarshal(struct {
		LastBySubject string `json:"last_by_subj"`
	}{s.lay.bucketSubject(key)})
	m, err := s.nc.RequestWithContext(rctx, "$JS.API.STREAM.MSG.GET."+s.lay.kvStream(), req)
	if err != nil {
		return nil, 0, err
	}
	var resp struct {
		Message *struct {
			Header []byte `json:"hdrs"`
			Data   []byte `json:"data"`
			Seq    uint64 `json:"seq"`
		} `json:"message"`
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return nil, 0, err
	}
	switch {
	case isAPIError(resp.Error, jsNoMessageFound):
		return nil, 0, errNoRecord
	case resp.Error != nil:
		return nil, 0, resp.Error
	case resp.Message == nil:
		return nil, 0, errors.New("empty answer")
	}
	if len(resp.Message.Header) > 0 {
		h, err := nats.DecodeHeadersMsg(resp.Message.Header)
		if err != nil {
			return nil, 0, err
		}
		// A deleted or purged key leaves a marker as its last message.
		if op := h.Get("KV-Operation"); op == "DEL" || op == "PURGE" {
			return nil, resp.Message.Seq, errNoRecord
		}
	}
	return resp.Message.Data, resp.Message.Seq, nil
}

// Name returns the semaphore's name.
func (s *Semaphore) Name() string { return s.name }

// Permits returns the number of permits as last read from the broker.
func (s *Semaphore) Permits() int { return s.cfg.Get().Permits }

// Lease returns the semaphore's lease.
func (s *Semaphore) Lease() time.Duration { return s.cfg.Get().Lease }

// Close makes later calls return tokensem.ErrClosed and wakes callers
// blocked in Acquire (they return ErrClosed). Held permits stay valid until
// released or lost. The NATS connection belongs to the caller and stays open.
func (s *Semaphore) Close() error {
	defer s.gates.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		close(s.done)
		s.returned.close()
		for _, w := range s.idle {
			w.drop()
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

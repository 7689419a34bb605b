package amqpsem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/driver"
	"github.com/tokensem/tokensem/internal/backoff"
	"github.com/tokensem/tokensem/internal/cfgcache"
	"github.com/tokensem/tokensem/internal/ctxerr"
	"github.com/tokensem/tokensem/internal/weighted"
)

var (
	_ tokensem.Semaphore = (*Semaphore)(nil)
	_ tokensem.Counter   = (*Semaphore)(nil)
)

// Semaphore is a distributed semaphore whose permits are token messages in
// a durable RabbitMQ queue. Create one with Init or Open; it is safe for
// concurrent use.
type Semaphore struct {
	c     *Conn
	name  string
	opts  options
	codec driver.Codec
	log   *slog.Logger

	cfg cfgcache.Cache[config] // as last read; see freshConfig

	gates weighted.Gate[*Semaphore] // see gate: made by the first AcquireN of k > 1

	// life ends when Close is called: callers blocked in Acquire return
	// ErrClosed, and the Semaphore's own goroutines stop.
	life context.Context
	end  context.CancelFunc

	waiters atomic.Int64 // callers waiting in Acquire (see enterWait)

	orphanMu  sync.Mutex     // guards orphanRun and orphanAt (see startOrphanCheck)
	orphanRun bool           // a check is running
	orphanAt  time.Time      // when the last check ended
	tasks     sync.WaitGroup // the Semaphore's goroutines: orphan checks, quarantines

	mu          sync.Mutex
	held        map[int]bool        // slots this process holds
	missing     map[int]bool        // slots whose claim queue this process found gone (see claimSlot)
	quarantines map[int]*quarantine // running (see startQuarantine)
	idle        []*pooledChannel
	closed      bool
}

// Init creates semaphore name with permits tokens, or opens it if it already
// exists with the same number of permits. It is idempotent and safe to run
// from many processes at once: an exclusive lock queue serializes creators,
// so exactly N tokens are published.
//
// Errors: tokensem.ErrInvalidName, tokensem.ErrInvalidPermits,
// tokensem.ErrInvalidOption, tokensem.ErrPermitMismatch,
// tokensem.ErrKeyMismatch, tokensem.ErrClosed, or a wrapped broker error.
func Init(ctx context.Context, c *Conn, name string, permits int, opts ...Option) (*Semaphore, error) {
	if err := tokensem.ValidateName(name); err != nil {
		return nil, err
	}
	if err := tokensem.ValidatePermits(permits); err != nil {
		return nil, err
	}
	s, err := newSemaphore(c, name, opts)
	if err != nil {
		return nil, err
	}
	return s.init(ctx, permits)
}

// init is Init with a name and permit count already checked (or, for a
// gate, made by the library).
//
// The locked work is tried again when the connection under it is lost (the
// Conn's watchdog drops one that a loaded machine left silent, and connects
// again) or the broker fails it for a while: it is idempotent, as a second
// Init is after a first that died, and holds no permit.
func (s *Semaphore) init(ctx context.Context, permits int) (*Semaphore, error) {
	var cfg config
	err := s.retryLocking(ctx, "init", func() (err error) {
		cfg, err = s.initLocked(ctx, permits)
		return err
	})
	if err != nil {
		return nil, ctxerr.After(ctx, err)
	}
	s.setConfig(cfg)
	return s, nil
}

func (s *Semaphore) initLocked(ctx context.Context, permits int) (config, error) {
	name := s.name
	ctx, unlock, err := s.lock(ctx)
	if err != nil {
		return config{}, err
	}
	defer unlock()
	cfg, err := s.loadConfig(ctx)
	switch {
	case err == nil && cfg.State == stateDeleting:
		// A delete that waited for stalled holders did not finish: finish
		// it (its wait included) before the new life begins.
		if err := s.finishDelete(ctx, cfg); err != nil {
			return config{}, err
		}
		return s.create(ctx, permits, nil, cfg.maxFenceBase())
	case err == nil && cfg.ready():
		if cfg.Permits != permits {
			return config{}, &tokensem.PermitMismatchError{Name: name, Have: cfg.Permits, Want: permits}
		}
		if err := s.codec.CheckKey(s.name, cfg.KeyCheck); err != nil {
			return config{}, err
		}
		if err := s.checkHoldBound(cfg); err != nil {
			return config{}, err
		}
		return cfg, nil
	case err == nil: // a creation that died half-way: nobody can have opened it
		return s.create(ctx, permits, &cfg, cfg.maxFenceBase())
	case errors.Is(err, tokensem.ErrNotInitialized):
		return s.create(ctx, permits, nil, 0)
	}
	return config{}, err
}

// Open opens an existing semaphore; only its name is needed. The Conn's
// heartbeat must be at most the one the semaphore was made with (see
// WithHeartbeat): a holder must give up its permit within the time the
// semaphore's repairs and deletes wait for it.
//
// Errors: tokensem.ErrInvalidName, tokensem.ErrInvalidOption (a heartbeat
// too long for the semaphore among them), tokensem.ErrNotInitialized,
// tokensem.ErrKeyMismatch, tokensem.ErrClosed, or a wrapped broker error.
func Open(ctx context.Context, c *Conn, name string, opts ...Option) (*Semaphore, error) {
	if err := tokensem.ValidateName(name); err != nil {
		return nil, err
	}
	s, err := newSemaphore(c, name, opts)
	if err != nil {
		return nil, err
	}
	return s.open(ctx)
}

// open is Open with a name already checked (or, for a gate, made by the
// library).
func (s *Semaphore) open(ctx context.Context) (*Semaphore, error) {
	cfg, err := s.readConfig(ctx)
	if err != nil {
		return nil, ctxerr.After(ctx, err)
	}
	if err := s.codec.CheckKey(s.name, cfg.KeyCheck); err != nil {
		return nil, err
	}
	if err := s.checkHoldBound(cfg); err != nil {
		return nil, err
	}
	s.setConfig(cfg)
	return s, nil
}

// checkHoldBound refuses a Conn whose holders could believe they hold for
// longer than the semaphore's W (see config.HoldBoundMS): a repair or a
// delete would not wait long enough for them.
func (s *Semaphore) checkHoldBound(cfg config) error {
	if b := s.c.holdBound(); b > cfg.holdBound() {
		return fmt.Errorf("%w: the connection's heartbeat %v lets a holder cut off from the broker believe it holds for %v, "+
			"longer than the %v semaphore %s was made for: dial with WithHeartbeat(%v) or less",
			tokensem.ErrInvalidOption, s.c.heartbeat, b, cfg.holdBound(), s.name, heartbeatFor(cfg.holdBound()))
	}
	return nil
}

// setConfig caches cfg, dated by when its read began (one this client
// wrote, readAt unset, is current now), unless a value whose read began
// later is cached.
func (s *Semaphore) setConfig(cfg config) {
	at := cfg.readAt
	if at.IsZero() {
		at = time.Now()
	}
	s.cfg.SetAt(cfg, at)
}

// configTTL is how long an acquirer trusts the configuration it read
// (driver.ConfigTTL): a repair waits it out before it issues a slot's new
// current token.
const configTTL = driver.ConfigTTL

// configAhead is the age at which a use of the configuration starts
// reading it again in the background (cfgcache.Cache.Ahead), before it is
// configTTL old: a handle in steady use then never waits for a read in
// its acquire. Readers of the one configuration message take turns (each
// takes it and returns it), so a read can take several ms; before reads
// ahead, the bench's high-class caller waited about 9 ms more in the one
// acquire in a hundred that read it (its p99).
const configAhead = configTTL * 3 / 4

// freshConfig returns the configuration, re-reading it when the read it
// came from began configTTL ago or more; from configAhead on, it starts a
// read in the background.
func (s *Semaphore) freshConfig(ctx context.Context) (config, error) {
	s.cfg.Ahead(s.life, configAhead, s.readConfig, s.spawn)
	return s.cfg.Fresh(ctx, configTTL, s.readConfig)
}

// spawn runs f on a goroutine of the Semaphore's, which Close waits for
// (f must end with s.life), or returns false once Close has been called.
func (s *Semaphore) spawn(f func()) bool {
	if !s.track() {
		return false
	}
	go func() {
		defer s.tasks.Done()
		f()
	}()
	return true
}

// refreshConfig re-reads the configuration (it changes on resize and
// repair).
func (s *Semaphore) refreshConfig(ctx context.Context) (config, error) {
	return s.cfg.Refresh(ctx, s.readConfig)
}

// transient reports whether err is a broker failure that trying again may
// cure: one wrapping tokensem.ErrUnavailable that does not say the
// semaphore is gone, the credentials or the operation are refused, or the
// lock the work ran under is lost (only taking the lock again cures that:
// see retryLocking).
func transient(err error) bool {
	return errors.Is(err, tokensem.ErrUnavailable) && !errors.Is(err, tokensem.ErrNotInitialized) &&
		!errors.Is(err, tokensem.ErrClosed) && !errors.Is(err, ErrAuth) && !errors.Is(err, ErrTLS) &&
		!errors.Is(err, tokensem.ErrPermissionDenied) &&
		!errors.Is(err, errLockLost)
}

// retry runs step until it succeeds, fails for good, or ctx ends: a broker
// that fails a request for a while (a quorum queue electing a leader
// answers basic.get with 541 and closes the connection) is waited out.
func (s *Semaphore) retry(ctx context.Context, what string, step func() error) error {
	return backoff.Retry(ctx, backoff.Backoff{Min: 50 * time.Millisecond, Max: time.Second}, s.life.Done(), transient,
		func(err error) { s.log.Warn(what+": the broker failed; retrying", "err", err) }, step)
}

// retryLocking is retry for a step that takes the lock itself: a step
// whose lock was lost is tried again too, under the lock taken again.
func (s *Semaphore) retryLocking(ctx context.Context, what string, step func() error) error {
	return backoff.Retry(ctx, backoff.Backoff{Min: 50 * time.Millisecond, Max: time.Second}, s.life.Done(), lifecycleRetryable,
		func(err error) { s.log.Warn(what+": the broker failed; retrying", "err", err) }, step)
}

// lifecycleRetryable reports whether a step that takes the lock itself
// (Init, Delete, the registry's work) may be tried again after err: a
// transient failure, a lost lock or connection, but not a refusal the
// broker gives for a reason that stays (a queue declared with other
// arguments, an operation the broker does not allow).
func lifecycleRetryable(err error) bool {
	return (transient(err) || errors.Is(err, errLockLost) || isConnectionLost(err)) &&
		!isCode(err, amqp.PreconditionFailed) && !isCode(err, amqp.NotAllowed) && !isCode(err, amqp.NotImplemented)
}

func newSemaphore(c *Conn, name string, opts []Option) (*Semaphore, error) {
	if c == nil {
		return nil, fmt.Errorf("%w: nil connection", tokensem.ErrInvalidOption)
	}
	o, err := newOptions(opts)
	if err != nil {
		return nil, err
	}
	return newSemaphoreWith(c, name, o), nil
}

func newSemaphoreWith(c *Conn, name string, o options) *Semaphore {
	life, end := context.WithCancel(context.Background())
	return &Semaphore{
		c: c, name: name, opts: o, codec: driver.NewCodec(o.Key),
		log: o.Logger.With("semaphore", name), life: life, end: end,
		held: make(map[int]bool), missing: make(map[int]bool), quarantines: make(map[int]*quarantine),
	}
}

func (s *Semaphore) rtt(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.opts.RequestTimeout)
}

// Name returns the semaphore's name.
func (s *Semaphore) Name() string { return s.name }

// Permits returns the number of permits as last read from the broker.
func (s *Semaphore) Permits() int { return s.cfg.Get().Permits }

func (s *Semaphore) config() config { return s.cfg.Get() }

// Close makes later calls return tokensem.ErrClosed, wakes callers
// blocked in Acquire (they return ErrClosed) and stops a running orphan
// check (see WithOrphanRepair) or quarantine (see claim.go), waiting for
// them. Held permits stay valid until released or lost. The Conn belongs
// to the caller and stays open.
func (s *Semaphore) Close() error {
	defer s.tasks.Wait() // runs last: they end with life
	defer s.gates.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		s.end()
		for _, pc := range s.idle {
			_ = pc.ch.Close()
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

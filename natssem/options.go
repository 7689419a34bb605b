package natssem

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/semopts"
)

// Defaults of the NATS-specific options.
const (
	// DefaultReplicas is the replication factor of the token stream and KV
	// bucket created by Init.
	DefaultReplicas = 1
	// DefaultMaxWaiters is the number of callers that may wait in Acquire
	// at once, across all processes (the consumer's MaxWaiting). The NATS
	// default of 512 is too small for large fleets.
	DefaultMaxWaiters = 4096
	// DefaultMaxLocalWaiters is the number of callers of one Semaphore
	// (one handle, in one process) that may wait in Acquire at once: a
	// quarter of DefaultMaxWaiters, so that one runaway process cannot
	// take every place in the queue.
	DefaultMaxLocalWaiters = 1024
	// DefaultPullExpiry is how long one waiting pull request lives at the
	// server. A caller still waiting then re-issues it and, like a fresh
	// caller, goes to the back of the queue.
	DefaultPullExpiry = 5 * time.Minute
	// DefaultPullHeartbeat is the idle heartbeat the server sends a waiting
	// caller; two missed heartbeats make the caller re-issue its pull
	// (covering a lost request). A reconnection (a restarted server, a
	// failover to another node) re-issues it at once.
	DefaultPullHeartbeat = 5 * time.Second
)

type options struct {
	semopts.Options
	Lease      time.Duration // see WithLease
	HolderName string        // see WithHolderName
	group      string        // see WithGroup
	replicas   int
	maxWaiters int
	maxLocal   int // see WithMaxLocalWaiters
	pullExpiry time.Duration
	heartbeat  time.Duration
	leaseSet   bool
	timeoutSet bool
}

// Option configures Init and Open. Invalid values make Init or Open return
// an error wrapping tokensem.ErrInvalidOption.
type Option func(*options) error

func newOptions(opts []Option) (options, error) {
	o := options{
		Options:    semopts.Defaults(),
		Lease:      tokensem.DefaultLease,
		HolderName: semopts.DefaultHolderName(),
		replicas:   DefaultReplicas,
		maxWaiters: DefaultMaxWaiters,
		maxLocal:   DefaultMaxLocalWaiters,
		pullExpiry: DefaultPullExpiry,
		heartbeat:  DefaultPullHeartbeat,
	}
	for _, opt := range opts {
		if opt == nil {
			continue
		}
		if err := opt(&o); err != nil {
			return options{}, err
		}
	}
	// The server refuses a pull whose heartbeat exceeds half its expiry.
	o.heartbeat = min(o.heartbeat, o.pullExpiry/4)
	return o, nil
}

func common(opt semopts.Option) Option {
	return func(o *options) error { return opt(&o.Options) }
}

// WithLease sets the lease of a semaphore created by Init (default
// tokensem.DefaultLease, within [tokensem.MinLease, tokensem.MaxLease]).
// Every client uses the lease stored at creation; Open ignores this option.
func WithLease(d time.Duration) Option {
	return func(o *options) error {
		if err := semopts.CheckLease(d); err != nil {
			return err
		}
		o.Lease, o.leaseSet = d, true
		return nil
	}
}

// WithKey sets the shared HMAC-SHA256 key (at least 16 bytes) that signs
// tokens at Init and verifies them on every acquire: with a key, unsigned
// or forged tokens never admit. Every client of a signed semaphore must use
// the same key (Open checks it). Default: no key.
func WithKey(key []byte) Option { return common(semopts.WithKey(key)) }

// WithObserver reports this client's acquisitions, releases, losses and
// renewals to o, for metrics (see package semmetrics) or an adaptive limit
// (see package adaptive). Given more than once, each observer sees every
// event, in the order given. Default: none.
func WithObserver(o tokensem.Observer) Option { return common(semopts.WithObserver(o)) }

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option { return common(semopts.WithLogger(l)) }

// WithHolderName names this client in lease records and Status (1..128
// bytes without control characters; default "host:pid").
func WithHolderName(name string) Option {
	return func(o *options) error {
		if err := semopts.CheckHolderName(name); err != nil {
			return err
		}
		o.HolderName = name
		return nil
	}
}

// WithRequestTimeout bounds each broker round trip. It must be shorter
// than the semaphore's lease minus lease/5 (Init and Open return an error
// wrapping tokensem.ErrInvalidOption otherwise). Default: the smaller of
// tokensem.DefaultRequestTimeout and a quarter of the lease.
func WithRequestTimeout(d time.Duration) Option {
	return func(o *options) error {
		o.timeoutSet = true
		return semopts.WithRequestTimeout(d)(&o.Options)
	}
}

// WithReplicas sets the replication factor of the stream and KV bucket that
// Init creates: 1 or 3 (3 needs a JetStream cluster). Default 1.
func WithReplicas(n int) Option {
	return func(o *options) error {
		if n != 1 && n != 3 {
			return fmt.Errorf("%w: replicas %d (want 1 or 3)", tokensem.ErrInvalidOption, n)
		}
		o.replicas = n
		return nil
	}
}

// WithGroup makes the semaphore one key of group: the semaphores of a
// group share one token stream and one KV bucket (see ResourcesOf),
// each key with a subject of its own, a consumer filtered on it, and its
// records under a key prefix, so that many
// semaphores (one per tenant, per route: see semgroup) cost the broker a
// consumer each rather than two streams each. Every guarantee holds per
// key as for a semaphore of its own. Init, Open, Delete and ForceDelete of
// a key all take the option; the group's stream and bucket are made by its
// first Init (with that Init's WithReplicas) and stay when its keys are
// deleted. The name must be valid as a semaphore name is
// (tokensem.ValidateName). A group holds up to MaxGroupKeys keys.
//
// A key's Resize and Delete also write the group's generation record
// (`_generation` in the group's bucket), by which every client of the group
// learns that a key's configuration changed: a client reads it at most
// once per 2 s and connection instead of re-reading each key it uses.
// Clients of versions before it refuse keys made since.
func WithGroup(group string) Option {
	return func(o *options) error {
		if err := tokensem.ValidateName(group); err != nil {
			return fmt.Errorf("%w: group: %w", tokensem.ErrInvalidOption, err)
		}
		o.group = group
		return nil
	}
}

// WithMaxWaiters sets how many callers may wait in Acquire at once across
// all clients (default DefaultMaxWaiters, 1..1,000,000). Fixed by Init.
func WithMaxWaiters(n int) Option {
	return func(o *options) error {
		if n < 1 || n > 1_000_000 {
			return fmt.Errorf("%w: max waiters %d (want 1..1000000)", tokensem.ErrInvalidOption, n)
		}
		o.maxWaiters = n
		return nil
	}
}

// WithMaxLocalWaiters sets how many callers of this Semaphore may wait in
// Acquire (and AcquireN) at once (default DefaultMaxLocalWaiters,
// 1..1,000,000); one more is refused at once with
// tokensem.ErrTooManyWaiters. WithMaxWaiters caps the waiters of every
// client together at the server; this cap keeps one process (a retry storm,
// a leak of goroutines) from taking all of those places. It bounds callers
// of this library only: a client with pull rights that is not one can still
// queue up to WithMaxWaiters pulls (see docs/permissions-nats.md).
func WithMaxLocalWaiters(n int) Option {
	return func(o *options) error {
		if n < 1 || n > 1_000_000 {
			return fmt.Errorf("%w: max local waiters %d (want 1..1000000)", tokensem.ErrInvalidOption, n)
		}
		o.maxLocal = n
		return nil
	}
}

// WithPullExpiry sets how long one waiting pull request lives at the server
// before the caller re-issues it (default DefaultPullExpiry, at least 1s).
func WithPullExpiry(d time.Duration) Option {
	return func(o *options) error {
		if d < time.Second {
			return fmt.Errorf("%w: pull expiry %v (want >= 1s)", tokensem.ErrInvalidOption, d)
		}
		o.pullExpiry = d
		return nil
	}
}

// WithPullHeartbeat sets the idle heartbeat the server sends a waiting caller
// (default DefaultPullHeartbeat, 100ms..1m, at most a quarter of the pull
// expiry). A caller whose pull sees no heartbeat re-issues it, or, if the
// consumer's waiter queue is full, fails with tokensem.ErrTooManyWaiters:
// so a lower value detects both sooner, at the cost of more messages.
func WithPullHeartbeat(d time.Duration) Option {
	return func(o *options) error {
		if d < 100*time.Millisecond || d > time.Minute {
			return fmt.Errorf("%w: heartbeat %v (want 100ms..1m)", tokensem.ErrInvalidOption, d)
		}
		o.heartbeat = d
		return nil
	}
}

// checkRequestTimeout refuses a request timeout set by WithRequestTimeout
// that is not shorter than maxRequestTimeout(lease).
func (o *options) checkRequestTimeout(lease time.Duration) error {
	if o.timeoutSet && o.RequestTimeout >= maxRequestTimeout(lease) {
		return fmt.Errorf("%w: request timeout %v must be shorter than %v (lease %v minus lease/5): a round trip that long outlives a holder's permit",
			tokensem.ErrInvalidOption, o.RequestTimeout, maxRequestTimeout(lease), lease)
	}
	return nil
}

package amqpsem

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/semopts"
)

// Queue types for the token queue.
const (
	Quorum  = "quorum"  // replicated, counts deliveries (the fencing number); the default
	Classic = "classic" // single node; Fence is always 0
)

// DefaultMaxHold is the longest a permit is held before the client releases
// it itself: below RabbitMQ's default consumer_timeout of 30 minutes, after
// which the broker would close the holder's channel (3.10 checks it only
// once a minute).
const DefaultMaxHold = 25 * time.Minute

type options struct {
	semopts.Options
	queueType    string
	maxHold      time.Duration
	orphanRepair time.Duration // 0: off
	maxWaiters   int           // 0: only the Conn's cap
}

// Option configures Init and Open; invalid values make them return an error
// wrapping tokensem.ErrInvalidOption.
type Option func(*options) error

func newOptions(opts []Option) (options, error) {
	o := options{Options: semopts.Defaults(), queueType: Quorum, maxHold: DefaultMaxHold, orphanRepair: DefaultOrphanRepair}
	for _, opt := range opts {
		if opt == nil {
			continue
		}
		if err := opt(&o); err != nil {
			return options{}, err
		}
	}
	return o, nil
}

func common(opt semopts.Option) Option {
	return func(o *options) error { return opt(&o.Options) }
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

// WithRequestTimeout bounds each broker round trip (default
// tokensem.DefaultRequestTimeout).
func WithRequestTimeout(d time.Duration) Option { return common(semopts.WithRequestTimeout(d)) }

// WithQueueType picks the token queue type at Init: Quorum (default) or
// Classic.
func WithQueueType(t string) Option {
	return func(o *options) error {
		if t != Quorum && t != Classic {
			return fmt.Errorf("%w: queue type %q (want %q or %q)", tokensem.ErrInvalidOption, t, Quorum, Classic)
		}
		o.queueType = t
		return nil
	}
}

// WithMaxHold sets how long a permit may be held before the client releases
// it and closes its Done channel (default DefaultMaxHold; at least 1s). Keep
// it below the broker's consumer_timeout.
func WithMaxHold(d time.Duration) Option {
	return func(o *options) error {
		if d < time.Second {
			return fmt.Errorf("%w: max hold %v (want >= 1s)", tokensem.ErrInvalidOption, d)
		}
		o.maxHold = d
		return nil
	}
}

// DefaultOrphanRepair is how long Acquire waits for a token before it
// looks for slots whose token nobody can be given (see WithOrphanRepair).
const DefaultOrphanRepair = 10 * time.Second

// WithOrphanRepair sets how long a caller of Acquire waits with no token
// before it checks that every slot has a holder (default
// DefaultOrphanRepair; 0 turns the check off; else at least 1s). When some
// slot has none and stays so, its token is lost or checked out to a
// consumer that no longer exists, which RabbitMQ 3.10 can keep doing after
// a queue leader's node is lost, until that leader restarts: the caller
// then runs a repair (reconciler.RunWithoutGate) on a connection of its own, which
// issues a replacement, so waiters are not stopped until an operator
// repairs. Later checks of the same wait come at doubling intervals, up to
// eight times d; the callers of one Semaphore check one at a time.
func WithOrphanRepair(d time.Duration) Option {
	return func(o *options) error {
		if d != 0 && d < time.Second {
			return fmt.Errorf("%w: orphan repair after %v (want 0 or >= 1s)", tokensem.ErrInvalidOption, d)
		}
		o.orphanRepair = d
		return nil
	}
}

// WithMaxLocalWaiters caps the callers waiting in Acquire at once on this
// Semaphore (1..65,535; default: only the Conn's cap, see
// WithMaxConnWaiters); one more fails at once with
// tokensem.ErrTooManyWaiters. Each waiter of AcquireN's k counts. It is
// natssem.WithMaxLocalWaiters' counterpart; RabbitMQ has no cap of all
// clients' waiters together (natssem.WithMaxWaiters): bound them with user
// limits (docs/permissions-rabbitmq.md).
func WithMaxLocalWaiters(n int) Option {
	return func(o *options) error {
		if n < 1 || n > 65535 {
			return fmt.Errorf("%w: max waiters %d (want 1..65535)", tokensem.ErrInvalidOption, n)
		}
		o.maxWaiters = n
		return nil
	}
}

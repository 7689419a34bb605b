// Package semopts holds what the backends share behind their own options
// and observers: the common settings with their validation, and the report
// of an acquisition to an Observer. Users configure a backend with its own
// With… options (natssem.WithKey, amqpsem.WithKey, …); this package is the
// one place those validate.
package semopts

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/tokensem/tokensem"
)

// Options holds the settings every backend understands. Backends embed it
// and wrap the Option constructors below in their own option type.
type Options struct {
	Key            []byte            // see WithKey
	Logger         *slog.Logger      // see WithLogger
	RequestTimeout time.Duration     // see WithRequestTimeout
	Observer       tokensem.Observer // see WithObserver
}

// Option changes Options and rejects invalid values with an error wrapping
// tokensem.ErrInvalidOption.
type Option func(*Options) error

// Defaults returns the defaults: no signing key, a logger that discards
// everything, and tokensem.DefaultRequestTimeout.
func Defaults() Options {
	return Options{Logger: slog.New(slog.DiscardHandler), RequestTimeout: tokensem.DefaultRequestTimeout}
}

// WithKey sets the shared HMAC-SHA256 key that signs tokens at Init and
// verifies them on every acquire: with a key, unsigned or forged tokens never
// admit. Every client of a signed semaphore must use the same key (Open
// checks it). At least 16 bytes.
func WithKey(key []byte) Option {
	return func(o *Options) error {
		if len(key) < 16 {
			return fmt.Errorf("%w: signing key of %d bytes (need at least 16)", tokensem.ErrInvalidOption, len(key))
		}
		o.Key = append([]byte(nil), key...)
		return nil
	}
}

// WithLogger sets the structured logger.
func WithLogger(l *slog.Logger) Option {
	return func(o *Options) error {
		if l == nil {
			return fmt.Errorf("%w: nil logger", tokensem.ErrInvalidOption)
		}
		o.Logger = l
		return nil
	}
}

// WithRequestTimeout bounds each single broker round trip; it must be
// positive.
func WithRequestTimeout(d time.Duration) Option {
	return func(o *Options) error {
		if d <= 0 {
			return fmt.Errorf("%w: request timeout %v", tokensem.ErrInvalidOption, d)
		}
		o.RequestTimeout = d
		return nil
	}
}

// WithObserver adds an Observer of this client's permits: given more than
// once, each observer sees every event, in the order given.
func WithObserver(obs tokensem.Observer) Option {
	return func(o *Options) error {
		if obs == nil {
			return fmt.Errorf("%w: nil observer", tokensem.ErrInvalidOption)
		}
		switch cur := o.Observer.(type) {
		case nil:
			o.Observer = obs
		case observers:
			o.Observer = append(cur[:len(cur):len(cur)], obs)
		default:
			o.Observer = observers{cur, obs}
		}
		return nil
	}
}

// observers are several Observers of one client, called in order.
type observers []tokensem.Observer

func (os observers) Observe(e tokensem.Event) {
	for _, o := range os {
		o.Observe(e)
	}
}

// CheckLease checks a lease: it must lie in [tokensem.MinLease,
// tokensem.MaxLease].
func CheckLease(d time.Duration) error {
	if d < tokensem.MinLease || d > tokensem.MaxLease {
		return fmt.Errorf("%w: lease %v outside [%v, %v]", tokensem.ErrInvalidOption, d, tokensem.MinLease, tokensem.MaxLease)
	}
	return nil
}

// MaxHolderName is the longest holder name: records that name a longer one
// are not a client's.
const MaxHolderName = 128

// DefaultHolderName is "host:pid" (the host cut to fit MaxHolderName).
func DefaultHolderName() string {
	host, _ := os.Hostname()
	if host == "" {
		host = "unknown"
	}
	pid := ":" + strconv.Itoa(os.Getpid())
	return host[:min(len(host), MaxHolderName-len(pid))] + pid
}

// CheckHolderName checks a holder name: 1..MaxHolderName bytes without
// control characters.
func CheckHolderName(name string) error {
	if name == "" || len(name) > MaxHolderName || strings.ContainsFunc(name, unicode.IsControl) {
		return fmt.Errorf("%w: holder name must be 1..128 bytes without control characters", tokensem.ErrInvalidOption)
	}
	return nil
}

// OutcomeOf classifies the error an Acquire or TryAcquire returned.
func OutcomeOf(err error) tokensem.Outcome {
	switch {
	case err == nil:
		return tokensem.OutcomeAcquired
	case errors.Is(err, tokensem.ErrNoPermit):
		return tokensem.OutcomeNoPermit
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return tokensem.OutcomeTimeout
	default:
		return tokensem.OutcomeError
	}
}

// ObserveAcquire reports the end of an Acquire or TryAcquire that started
// at start to o (nil: nothing).
func ObserveAcquire(o tokensem.Observer, name string, permits int, start time.Time, err error) {
	if o == nil {
		return
	}
	o.Observe(tokensem.Event{Kind: tokensem.EventAcquire, Semaphore: name, Permits: permits,
		Outcome: OutcomeOf(err), Wait: time.Since(start), Err: err})
}

package tokensem

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// Defaults of the options shared by every backend.
const (
	// DefaultLease is how long a silent holder keeps its permit: a crashed
	// holder's permit returns within one lease. Live holders renew every
	// Lease/3, so long tasks never expire while their process runs.
	DefaultLease = 15 * time.Second
	// MinLease is the shortest lease accepted.
	MinLease = 500 * time.Millisecond
	// MaxLease is the longest lease accepted.
	MaxLease = 24 * time.Hour
	// DefaultRequestTimeout bounds one broker round trip (never the wait for
	// a permit, which only ctx bounds).
	DefaultRequestTimeout = 5 * time.Second
)

// Options holds the settings every backend understands. Backends embed it
// and wrap the Option constructors below in their own option type.
type Options struct {
	Lease          time.Duration // see WithLease
	Key            []byte        // see WithKey
	Logger         *slog.Logger  // see WithLogger
	HolderName     string        // see WithHolderName
	RequestTimeout time.Duration // see WithRequestTimeout
	Observer       Observer      // see WithObserver
}

// Option changes Options and rejects invalid values with an error wrapping
// ErrInvalidOption.
type Option func(*Options) error

// DefaultOptions returns the defaults: DefaultLease, no signing key, a
// logger that discards everything, holder name "host:pid" and
// DefaultRequestTimeout.
func DefaultOptions() Options {
	host, _ := os.Hostname()
	if host == "" {
		host = "unknown"
	}
	return Options{
		Lease:          DefaultLease,
		Logger:         slog.New(slog.DiscardHandler),
		HolderName:     host + ":" + strconv.Itoa(os.Getpid()),
		RequestTimeout: DefaultRequestTimeout,
	}
}

// WithLease sets the lease given to Init (stored with the semaphore and used
// by every client; Open reads it). Default DefaultLease; the value must lie
// in [MinLease, MaxLease].
func WithLease(d time.Duration) Option {
	return func(o *Options) error {
		if d < MinLease || d > MaxLease {
			return fmt.Errorf("%w: lease %v outside [%v, %v]", ErrInvalidOption, d, MinLease, MaxLease)
		}
		o.Lease = d
		return nil
	}
}

// WithKey sets the shared HMAC-SHA256 key that signs tokens at Init and
// verifies them on every acquire: with a key, unsigned or forged tokens never
// admit. Every client of a signed semaphore must use the same key (Open
// checks it). At least 16 bytes. Default: no key.
func WithKey(key []byte) Option {
	return func(o *Options) error {
		if len(key) < 16 {
			return fmt.Errorf("%w: signing key of %d bytes (need at least 16)", ErrInvalidOption, len(key))
		}
		o.Key = append([]byte(nil), key...)
		return nil
	}
}

// WithLogger sets the structured logger. Default: discard.
func WithLogger(l *slog.Logger) Option {
	return func(o *Options) error {
		if l == nil {
			return fmt.Errorf("%w: nil logger", ErrInvalidOption)
		}
		o.Logger = l
		return nil
	}
}

// WithHolderName names this client in lease records and Status (1..128
// printable bytes, no control characters). Default "host:pid".
func WithHolderName(name string) Option {
	return func(o *Options) error {
		if name == "" || len(name) > 128 || strings.ContainsFunc(name, unicode.IsControl) {
			return fmt.Errorf("%w: holder name must be 1..128 bytes without control characters", ErrInvalidOption)
		}
		o.HolderName = name
		return nil
	}
}

// WithRequestTimeout bounds each single broker round trip. Default
// DefaultRequestTimeout; must be positive.
func WithRequestTimeout(d time.Duration) Option {
	return func(o *Options) error {
		if d <= 0 {
			return fmt.Errorf("%w: request timeout %v", ErrInvalidOption, d)
		}
		o.RequestTimeout = d
		return nil
	}
}

// WithObserver sets an Observer of this client's permits (acquisitions,
// releases, losses, renewals), for metrics. Default: none.
func WithObserver(obs Observer) Option {
	return func(o *Options) error {
		if obs == nil {
			return fmt.Errorf("%w: nil observer", ErrInvalidOption)
		}
		o.Observer = obs
		return nil
	}
}

package semgroup

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/tokensem/tokensem"
)

// Defaults of the options.
const (
	// DefaultMaxSize is how many keys a Group keeps open at most.
	DefaultMaxSize = 1024
	// DefaultOpenTimeout bounds one InitFunc call.
	DefaultOpenTimeout = 30 * time.Second
)

type options struct {
	prefix      string
	permitsFor  func(key string) int
	maxSize     int
	openTimeout time.Duration
	log         *slog.Logger
}

// Option configures New. An invalid value makes New return an error
// wrapping tokensem.ErrInvalidOption.
type Option func(*options) error

func newOptions(opts []Option) (options, error) {
	o := options{
		maxSize:     DefaultMaxSize,
		openTimeout: DefaultOpenTimeout,
		log:         slog.New(slog.DiscardHandler),
	}
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

// WithPrefix puts prefix before every key to make the semaphore's name:
// key "42" with prefix "tenant-" is semaphore "tenant-42". The prefix must
// itself be a valid name (tokensem.ValidateName), and prefix+key must be
// one too. Default: no prefix, the key is the name.
func WithPrefix(prefix string) Option {
	return func(o *options) error {
		if err := tokensem.ValidateName(prefix); err != nil || len(prefix) >= tokensem.MaxNameLen {
			return fmt.Errorf("%w: prefix %q cannot start a semaphore name", tokensem.ErrInvalidOption, prefix)
		}
		o.prefix = prefix
		return nil
	}
}

// WithPermitsFunc sets the number of permits per key: f(key) is used when
// the key's semaphore is created; 0 means the group's default. f runs
// without any lock of the group held, once per open of a key. A result
// outside 1..tokensem.MaxPermits (other than 0) fails that key's open with
// an error wrapping tokensem.ErrInvalidPermits. Default: every key gets
// the default passed to New. f must not be nil.
func WithPermitsFunc(f func(key string) int) Option {
	return func(o *options) error {
		if f == nil {
			return fmt.Errorf("%w: nil permits function", tokensem.ErrInvalidOption)
		}
		o.permitsFor = f
		return nil
	}
}

// WithMaxSize bounds how many keys stay cached (and their semaphores open,
// except evicted ones still in use; see the package doc). Default
// DefaultMaxSize; at least 1.
func WithMaxSize(n int) Option {
	return func(o *options) error {
		if n < 1 {
			return fmt.Errorf("%w: max size %d (want at least 1)", tokensem.ErrInvalidOption, n)
		}
		o.maxSize = n
		return nil
	}
}

// WithOpenTimeout bounds each InitFunc call. Default DefaultOpenTimeout;
// must be positive.
func WithOpenTimeout(d time.Duration) Option {
	return func(o *options) error {
		if d <= 0 {
			return fmt.Errorf("%w: open timeout %v", tokensem.ErrInvalidOption, d)
		}
		o.openTimeout = d
		return nil
	}
}

// WithLogger sets the logger for opens, evictions and close errors.
// Default: discard.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) error {
		if l == nil {
			return fmt.Errorf("%w: nil logger", tokensem.ErrInvalidOption)
		}
		o.log = l
		return nil
	}
}

package semgroup

import (
	"context"
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
	idleExpiry  time.Duration // 0: none
	deleteFn    DeleteFunc
	allowKey    func(key string) bool // nil: every valid key
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

// WithKeyFilter admits only the keys for which allow returns true: a call
// with any other key fails with an error wrapping ErrKeyNotAllowed before
// anything reaches the broker. Keys usually come from outside (a header, a
// message field), and every new key creates a semaphore on the broker: a
// group that serves a known set of tenants should say which (AllowKeys).
// allow must not be nil, and is called once per call, without any lock of
// the group held. Default: every valid key.
func WithKeyFilter(allow func(key string) bool) Option {
	return func(o *options) error {
		if allow == nil {
			return fmt.Errorf("%w: nil key filter", tokensem.ErrInvalidOption)
		}
		o.allowKey = allow
		return nil
	}
}

// AllowKeys returns a key filter (WithKeyFilter) admitting exactly keys.
func AllowKeys(keys ...string) func(key string) bool {
	set := make(map[string]bool, len(keys))
	for _, k := range keys {
		set[k] = true
	}
	return func(key string) bool { return set[key] }
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

// DeleteFunc deletes semaphore name unless a permit of it is held
// anywhere: natssem.Delete or amqpsem.Delete in a closure, never their
// ForceDelete. It must return an error wrapping tokensem.ErrHeld when a
// permit is held, and one wrapping tokensem.ErrNotInitialized when the
// semaphore does not exist.
type DeleteFunc func(ctx context.Context, name string) error

// WithIdleExpiry deletes a key's semaphore from the broker once this Group
// has not used it for d: no call for the key and no unreleased permit of
// it, whether the key is still cached or was evicted. del deletes it (see
// DeleteFunc); each delete is bounded by the open timeout. Keys are
// checked every d/4 (at most every minute, at least every 10 ms), so a
// key goes within about 1.25 d of its last use.
//
// Other replicas may use the same keys. A delete is refused while any
// client holds a permit (the backends' Delete claims every slot first, so
// a permit is never taken from under a holder); the key is then left to
// the next use and idle period. A replica whose cached semaphore was
// deleted meanwhile finds out on its next call (tokensem.ErrNotInitialized
// from the broker), opens the key again — the InitFunc creates it, after
// waiting for a delete in progress — and retries (twice at most), so its
// callers see no error unless the key is deleted again and again under
// them; the InitFunc must therefore create (Init), not just open. A use
// of the key in this Group while its delete runs waits for the delete to
// end. Close stops the expiry; keys idle at Close are left on the broker.
//
// d must be positive and del not nil. Default: no expiry.
func WithIdleExpiry(d time.Duration, del DeleteFunc) Option {
	return func(o *options) error {
		if d <= 0 || del == nil {
			return fmt.Errorf("%w: idle expiry %v with a nil delete function %v", tokensem.ErrInvalidOption, d, del == nil)
		}
		o.idleExpiry, o.deleteFn = d, del
		return nil
	}
}

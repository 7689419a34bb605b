package httpsem

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/semgroup"
)

// Defaults of the options.
const (
	// DefaultWait is how long a request waits for a permit before it is
	// rejected.
	DefaultWait = time.Second
	// DefaultRetryAfter is the delay suggested to a rejected client.
	DefaultRetryAfter = time.Second
)

type options struct {
	wait       time.Duration
	retryAfter time.Duration
	reject     http.Handler
	onError    func(w http.ResponseWriter, r *http.Request, err error)
	log        *slog.Logger
	priority   func(r *http.Request) tokensem.Priority
}

// Option configures New. An invalid value makes New return an error
// wrapping tokensem.ErrInvalidOption.
type Option func(*options) error

func newOptions(opts []Option) (options, error) {
	o := options{
		wait:       DefaultWait,
		retryAfter: DefaultRetryAfter,
		reject:     http.HandlerFunc(tooManyRequests),
		onError:    serviceError,
		log:        slog.New(slog.DiscardHandler),
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

// WithWait sets how long a request waits for a permit before it is
// rejected (bounded also by the request's context). 0 does not wait: a
// request is admitted only if a permit is free at once. Default
// DefaultWait; must not be negative.
func WithWait(d time.Duration) Option {
	return func(o *options) error {
		if d < 0 {
			return fmt.Errorf("%w: wait %v is negative", tokensem.ErrInvalidOption, d)
		}
		o.wait = d
		return nil
	}
}

// WithRetryAfter sets the Retry-After header of a rejected request, sent in
// whole seconds rounded up (Retry-After: 0 for 0). Default
// DefaultRetryAfter; must not be negative.
func WithRetryAfter(d time.Duration) Option {
	return func(o *options) error {
		if d < 0 {
			return fmt.Errorf("%w: retry-after %v is negative", tokensem.ErrInvalidOption, d)
		}
		o.retryAfter = d
		return nil
	}
}

// WithRejectHandler sets the handler that answers a request which got no
// permit in time. The Retry-After header is already set when it runs; it
// should write status 429 (http.StatusTooManyRequests). Default: 429 with
// the text body "too many requests". h must not be nil.
func WithRejectHandler(h http.Handler) Option {
	return func(o *options) error {
		if h == nil {
			return fmt.Errorf("%w: nil reject handler", tokensem.ErrInvalidOption)
		}
		o.reject = h
		return nil
	}
}

// WithErrorHandler sets the function that answers a request which could not
// be gated for another reason than load: the Picker failed, the semaphore
// is closed, the broker failed. Default: 400 Bad Request when err wraps
// ErrNoKey or tokensem.ErrInvalidName, 403 Forbidden when it wraps
// semgroup.ErrKeyNotAllowed (a key the group's filter refuses), 503
// Service Unavailable otherwise.
// f must not be nil.
func WithErrorHandler(f func(w http.ResponseWriter, r *http.Request, err error)) Option {
	return func(o *options) error {
		if f == nil {
			return fmt.Errorf("%w: nil error handler", tokensem.ErrInvalidOption)
		}
		o.onError = f
		return nil
	}
}

// WithPriority sets the class each request waits in (see
// tokensem.WithPriority): the one class returns for it, so that, say,
// checkout requests are admitted before batch exports when both wait.
// Without it a request waits in the class its context carries (0 unless a
// handler before the gate set one). A class out of range fails the
// request as an error (see WithErrorHandler).
func WithPriority(class func(r *http.Request) tokensem.Priority) Option {
	return func(o *options) error {
		if class == nil {
			return fmt.Errorf("%w: nil priority function", tokensem.ErrInvalidOption)
		}
		o.priority = class
		return nil
	}
}

// WithLogger sets the logger for permits lost mid-request and failed
// releases. Default: discard.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) error {
		if l == nil {
			return fmt.Errorf("%w: nil logger", tokensem.ErrInvalidOption)
		}
		o.log = l
		return nil
	}
}

func tooManyRequests(w http.ResponseWriter, _ *http.Request) {
	http.Error(w, "too many requests", http.StatusTooManyRequests)
}

func serviceError(w http.ResponseWriter, _ *http.Request, err error) {
	if errors.Is(err, semgroup.ErrKeyNotAllowed) {
		http.Error(w, err.Error(), http.StatusForbidden)
		return
	}
	if errors.Is(err, ErrNoKey) || errors.Is(err, tokensem.ErrInvalidName) {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	http.Error(w, "service unavailable", http.StatusServiceUnavailable)
}

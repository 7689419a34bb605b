package httpsem

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/tokensem/tokensem"
)

// Gate is the middleware. Create one with New; it is safe for concurrent
// use and holds no resources of its own (the semaphores belong to the
// caller).
type Gate struct {
	pick       Picker
	opts       options
	retryAfter string
}

// New returns a Gate that admits each request under a permit of the
// semaphore pick chooses for it.
//
// Errors: tokensem.ErrInvalidOption (a nil pick or a bad option).
func New(pick Picker, opts ...Option) (*Gate, error) {
	if pick == nil {
		return nil, fmt.Errorf("%w: nil Picker", tokensem.ErrInvalidOption)
	}
	o, err := newOptions(opts)
	if err != nil {
		return nil, err
	}
	secs := (o.retryAfter + time.Second - 1) / time.Second
	return &Gate{pick: pick, opts: o, retryAfter: strconv.FormatInt(int64(secs), 10)}, nil
}

// Wrap returns next behind the gate (see the package doc). It has the
// shape of the usual middleware, func(http.Handler) http.Handler.
func (g *Gate) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sem, err := g.pick(r)
		if err != nil {
			g.opts.onError(w, r, err)
			return
		}
		ctx := r.Context()
		if g.opts.priority != nil {
			ctx = tokensem.WithPriority(ctx, g.opts.priority(r))
		}
		ran := false
		err = tokensem.Do(ctx, sem, func(ctx context.Context) error {
			ran = true
			next.ServeHTTP(w, r.WithContext(ctx))
			return nil
		}, tokensem.WithWait(g.opts.wait), tokensem.WithFallback(func(context.Context, error) error {
			w.Header().Set("Retry-After", g.retryAfter)
			g.opts.reject.ServeHTTP(w, r)
			return nil
		}))
		switch {
		case err == nil:
		case !ran:
			g.opts.onError(w, r, err)
		default:
			// The handler ran (and answered); the permit was lost under it
			// or its release failed. Nothing is left to tell the client.
			g.opts.log.Warn("request's permit lost or not released", "method", r.Method, "path", r.URL.Path, "err", err)
		}
	})
}

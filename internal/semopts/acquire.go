package semopts

import (
	"context"
	"time"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/ctxerr"
)

// Acquire is a backend's Acquire (noWait false) or TryAcquire, the same on
// every broker: take does the broker's work; a call that fails once ctx
// has ended returns ctx.Err() itself (ctxerr.After); the observer hears of
// every call (ObserveAcquire, with the count permits returns then); and a
// failure returns a nil Permit, never a typed nil.
func Acquire[P tokensem.Permit](ctx context.Context, o tokensem.Observer, name string, permits func() int,
	noWait bool, take func(ctx context.Context, noWait bool) (P, error)) (tokensem.Permit, error) {
	start := time.Now()
	p, err := take(ctx, noWait)
	err = ctxerr.After(ctx, err)
	if o != nil { // permits reads the configuration cache: not for nobody
		ObserveAcquire(o, name, permits(), start, err)
	}
	if err != nil {
		return nil, err
	}
	return p, nil
}

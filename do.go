package tokensem

import (
	"context"
	"errors"
	"time"
)

// ReleaseTimeout bounds the Release that Do performs after fn returns; it
// runs on a context detached from the caller's so that a cancelled ctx
// still returns the permit promptly.
const ReleaseTimeout = 10 * time.Second

// Do acquires a permit of s, runs fn with a context that is cancelled when
// fn returns or the permit is lost, and releases the permit. It returns the
// Acquire error, fn's error, and, if the permit was lost while fn ran, an
// error wrapping ErrLeaseLost (joined with fn's error), in that order of
// precedence. fn should stop touching the protected resource as soon as its
// ctx is done.
func Do(ctx context.Context, s Semaphore, fn func(ctx context.Context) error) error {
	p, err := s.Acquire(ctx)
	if err != nil {
		return err
	}
	fctx, cancel := context.WithCancelCause(ctx)
	stop := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-p.Done():
			cancel(p.Err())
		case <-stop:
		}
	}()
	ferr := fn(fctx)
	close(stop)
	<-watched
	cancel(nil)

	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), ReleaseTimeout)
	defer rcancel()
	rerr := p.Release(rctx)
	switch {
	case rerr == nil, errors.Is(rerr, ErrReleased):
		return ferr
	default:
		return errors.Join(ferr, rerr)
	}
}

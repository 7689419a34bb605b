package tokensem

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tokensem/tokensem/internal/ctxerr"
)

// ReleaseTimeout bounds the Release that Do performs after fn returns; it
// runs on a context detached from the caller's so that a cancelled ctx
// still returns the permit promptly.
const ReleaseTimeout = 10 * time.Second

// DoOption changes how Do acquires its permit. An invalid value makes Do
// return an error wrapping ErrInvalidOption before it acquires anything.
type DoOption func(*doOptions) error

type doOptions struct {
	wait     time.Duration // budget for the acquire; < 0: only ctx bounds it
	fallback func(ctx context.Context, err error) error
	weight   int
}

func newDoOptions(opts []DoOption) (doOptions, error) {
	o := doOptions{wait: -1, weight: 1}
	for _, opt := range opts {
		if opt == nil {
			continue
		}
		if err := opt(&o); err != nil {
			return doOptions{}, err
		}
	}
	return o, nil
}

// WithWait bounds how long Do waits for a permit: at most d, after which Do
// gives up with an error wrapping ErrNoPermit (or calls the fallback, see
// WithFallback). A d of 0 does not wait at all: Do uses TryAcquire. The
// budget covers only the acquire; fn runs under the caller's ctx. Default:
// no budget, Do waits until ctx ends. d must not be negative.
func WithWait(d time.Duration) DoOption {
	return func(o *doOptions) error {
		if d < 0 {
			return fmt.Errorf("%w: wait %v is negative", ErrInvalidOption, d)
		}
		o.wait = d
		return nil
	}
}

// WithFallback sets the function Do calls, instead of fn, when no permit
// came in time: TryAcquire found none (WithWait(0)), the WithWait budget
// ran out, ctx's deadline passed while waiting, or the broker refused
// another waiter (ErrTooManyWaiters). It receives the caller's ctx (which
// is already done when its deadline was the cause) and the acquire error,
// and its result is what Do returns. It is not called when ctx is
// cancelled, when the semaphore is closed, or on a broker error: those are
// returned as they are. Default: no fallback, Do returns the acquire error.
// fallback must not be nil.
func WithFallback(fallback func(ctx context.Context, err error) error) DoOption {
	return func(o *doOptions) error {
		if fallback == nil {
			return fmt.Errorf("%w: nil fallback", ErrInvalidOption)
		}
		o.fallback = fallback
		return nil
	}
}

// WithWeight makes Do hold k permits of its semaphore at once, all or
// nothing (see Weighted), for the whole of fn. The semaphore must be a
// Weighted one (natssem and amqpsem semaphores are). Default 1. k must be
// at least 1.
func WithWeight(k int) DoOption {
	return func(o *doOptions) error {
		if k < 1 {
			return fmt.Errorf("%w: weight %d (want at least 1)", ErrInvalidOption, k)
		}
		o.weight = k
		return nil
	}
}

// noPermitInTime reports whether err, the acquire error of a call under
// ctx, means only that no permit came in time: the cases in which Do calls
// its fallback. A deadline counts only when it is ctx's own, not the
// timeout of a broker round trip.
func noPermitInTime(ctx context.Context, err error) bool {
	return errors.Is(err, ErrNoPermit) || errors.Is(err, ErrTooManyWaiters) ||
		(errors.Is(ctx.Err(), context.DeadlineExceeded) && errors.Is(err, context.DeadlineExceeded))
}

// Do acquires a permit of s, runs fn with a context that is cancelled when
// fn returns or the permit is lost, and releases the permit. It returns the
// Acquire error, fn's error, and, if the permit was lost while fn ran, an
// error wrapping ErrLeaseLost (joined with fn's error), in that order of
// precedence. fn should stop touching the protected resource as soon as its
// ctx is done. Do reports how long fn ran, and whether its error wraps
// ErrOverload, to the semaphore's Observer (see ReportUse), which an
// adaptive limit reads.
//
// By default Do waits for a permit until ctx ends. WithWait gives the wait a
// budget, after which Do returns an error wrapping ErrNoPermit; WithFallback
// runs a function instead of failing when no permit came in time, so that a
// caller can shed load, serve a cached answer or queue the work elsewhere:
//
//	err := tokensem.Do(ctx, sem, render,
//		tokensem.WithWait(200*time.Millisecond),
//		tokensem.WithFallback(func(ctx context.Context, err error) error {
//			return serveStale(ctx)
//		}))
//
// Errors, besides those of fn and the fallback: ErrInvalidOption (a bad
// option), ErrNoPermit (no permit within the WithWait budget), ctx.Err()
// itself (ctx ended before a permit came), ErrClosed, ErrTooManyWaiters,
// ErrLeaseLost, or a broker error.
func Do(ctx context.Context, s Semaphore, fn func(ctx context.Context) error, opts ...DoOption) error {
	o, err := newDoOptions(opts)
	if err != nil {
		return err
	}
	p, err := o.acquire(ctx, s)
	if err != nil {
		err = ctxerr.Ended(ctx, err)
		if o.fallback != nil && noPermitInTime(ctx, err) {
			return o.fallback(ctx, err)
		}
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
	start := time.Now()
	ferr := fn(fctx)
	if r, ok := p.(useReporter); ok {
		r.ReportUse(time.Since(start), errors.Is(ferr, ErrOverload))
	}
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

// hold is what Do holds: a Permit, or a PermitSet under WithWeight.
type hold interface {
	Done() <-chan struct{}
	Err() error
	Release(ctx context.Context) error
}

// asHold keeps a nil *PermitSet from becoming a non-nil hold.
func asHold(ps *PermitSet, err error) (hold, error) {
	if err != nil {
		return nil, err
	}
	return ps, nil
}

// acquire takes a permit (or o.weight of them) within the wait budget.
func (o doOptions) acquire(ctx context.Context, s Semaphore) (hold, error) {
	take, try := func(ctx context.Context) (hold, error) { return s.Acquire(ctx) },
		func(ctx context.Context) (hold, error) { return s.TryAcquire(ctx) }
	if o.weight > 1 {
		w, ok := s.(Weighted)
		if !ok {
			return nil, fmt.Errorf("%w: WithWeight(%d) on a %T, which is not a tokensem.Weighted", ErrInvalidOption, o.weight, s)
		}
		take = func(ctx context.Context) (hold, error) { return asHold(w.AcquireN(ctx, o.weight)) }
		try = func(ctx context.Context) (hold, error) { return asHold(w.TryAcquireN(ctx, o.weight)) }
	}
	switch {
	case o.wait < 0:
		return take(ctx)
	case o.wait == 0:
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		return try(ctx)
	}
	actx, cancel := context.WithTimeoutCause(ctx, o.wait, errBudget)
	defer cancel()
	p, err := take(actx)
	if err != nil && ctx.Err() == nil && errors.Is(context.Cause(actx), errBudget) &&
		(errors.Is(err, context.DeadlineExceeded) || errors.Is(err, errBudget)) {
		return nil, fmt.Errorf("%w within %v", ErrNoPermit, o.wait)
	}
	return p, err
}

// errBudget is the cause of an acquire context whose WithWait budget ran out.
var errBudget = errors.New("tokensem: wait budget exhausted")

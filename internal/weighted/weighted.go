// Package weighted gathers several permits of one semaphore for a caller,
// all or nothing, for every backend: the algorithm behind AcquireN and
// TryAcquireN.
//
// Gatherers take turns through a gate: a semaphore of one permit beside the
// semaphore, named GateName(name), created on first use with the same lease
// and key. The holder of the gate issues its k acquires at once; they queue
// with the single-permit waiters in arrival order, so it holds all k once
// the waiters queued before it have been served. No two gatherers ever hold
// part of the permits at the same time, so none can deadlock another: a
// single-permit caller never holds while it waits, and only the gate's
// holder does. A gatherer whose gate permit is lost (its process froze past
// the gate's lease, say) hands back what it gathered and queues for the gate
// again, so two gatherers never gather at once for long.
package weighted

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/tokensem/tokensem"
)

// gatePrefix starts the name of every gate. No semaphore name can start
// with '_' (tokensem.ValidateName), so a gate's resources never collide with
// a semaphore's, and List can tell gates apart.
const gatePrefix = "_gate_"

// GateName returns the name of the gate of semaphore name.
func GateName(name string) string { return gatePrefix + name }

// IsGate reports whether name is a gate's name.
func IsGate(name string) bool { return strings.HasPrefix(name, gatePrefix) }

// Source is what a backend gives the gatherer.
type Source struct {
	// Sem is the semaphore whose permits are gathered.
	Sem tokensem.Semaphore
	// Gate returns the semaphore's gate, creating it on first use. A
	// non-nil stale is a gate that answered ErrNotInitialized (deleted with
	// its semaphore, which was then made again): Gate forgets it and makes
	// the gate afresh, if the semaphore itself exists.
	Gate func(ctx context.Context, stale tokensem.Semaphore) (tokensem.Semaphore, error)
	// Permits returns the semaphore's permit count, re-read from the broker
	// when the copy at hand may be stale: a resize can shrink it while a
	// gatherer waits.
	Permits func(ctx context.Context) (int, error)
}

// recheckEvery is how often a waiting gatherer re-reads the permit count.
const recheckEvery = time.Second

// check validates k against the permit count.
func (src Source) check(ctx context.Context, k int) error {
	if k < 1 {
		return fmt.Errorf("%w: weight %d (want at least 1)", tokensem.ErrInvalidPermits, k)
	}
	n, err := src.Permits(ctx)
	if err != nil {
		return err
	}
	if k > n {
		return fmt.Errorf("%w: weight %d, permits %d", tokensem.ErrWeightExceedsPermits, k, n)
	}
	return nil
}

// Acquire gathers k permits of src.Sem, waiting until ctx ends.
func Acquire(ctx context.Context, src Source, k int) (*tokensem.PermitSet, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := src.check(ctx, k); err != nil {
		return nil, err
	}
	if k == 1 {
		p, err := src.Sem.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		return tokensem.NewPermitSet(p), nil
	}
	gate, err := src.Gate(ctx, nil)
	if err != nil {
		return nil, err
	}
	refreshed := false
	for {
		g, err := gate.Acquire(ctx)
		if errors.Is(err, tokensem.ErrNotInitialized) && !refreshed {
			refreshed = true
			if gate, err = src.Gate(ctx, gate); err != nil {
				return nil, err
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		permits, err := src.gather(ctx, g, k)
		var set *tokensem.PermitSet
		if err == nil {
			set = tokensem.NewPermitSet(permits...) // watched before the gate goes
		}
		release(g)
		switch {
		case errors.Is(err, errStartOver):
			continue
		case err != nil:
			return nil, err
		}
		return set, nil
	}
}

// errStartOver sends a gatherer back to the gate: its gate permit, or a
// permit it had gathered, was lost while it waited for the rest.
var errStartOver = errors.New("weighted: start over")

type result struct {
	p   tokensem.Permit
	err error
}

// gather issues k acquires at once and waits for all of them, holding the
// gate permit g. On any failure it hands back whatever it got.
func (src Source) gather(ctx context.Context, g tokensem.Permit, k int) ([]tokensem.Permit, error) {
	gctx, cancel := context.WithCancel(ctx)
	defer cancel()
	results := make(chan result, k)
	for range k {
		go func() {
			p, err := src.Sem.Acquire(gctx)
			results <- result{p, err}
		}()
	}
	recheck := time.NewTicker(recheckEvery)
	defer recheck.Stop()
	var (
		got    []tokensem.Permit
		failed error
	)
	fail := func(err error) {
		if failed == nil {
			failed = err
			cancel()
		}
	}
	for received := 0; received < k; {
		select {
		case r := <-results:
			received++
			switch {
			case r.err != nil:
				fail(r.err)
			default:
				got = append(got, r.p)
			}
		case <-g.Done():
			fail(errStartOver)
			g = neverDone{} // once is enough
		case <-recheck.C:
			if failed == nil {
				if err := src.check(ctx, k); errors.Is(err, tokensem.ErrWeightExceedsPermits) {
					fail(err)
				}
			}
		}
	}
	if failed == nil {
		for _, p := range got {
			if p.Err() != nil {
				failed = errStartOver
				break
			}
		}
	}
	if failed != nil {
		release(got...)
		return nil, failed
	}
	return got, nil
}

// TryAcquire takes k free permits of src.Sem now, or none.
func TryAcquire(ctx context.Context, src Source, k int) (*tokensem.PermitSet, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := src.check(ctx, k); err != nil {
		return nil, err
	}
	if k == 1 {
		p, err := src.Sem.TryAcquire(ctx)
		if err != nil {
			return nil, err
		}
		return tokensem.NewPermitSet(p), nil
	}
	gate, err := src.Gate(ctx, nil)
	if err != nil {
		return nil, err
	}
	g, err := gate.TryAcquire(ctx)
	if errors.Is(err, tokensem.ErrNotInitialized) {
		if gate, err = src.Gate(ctx, gate); err != nil {
			return nil, err
		}
		g, err = gate.TryAcquire(ctx)
	}
	if errors.Is(err, tokensem.ErrNoPermit) {
		return nil, fmt.Errorf("%w: another caller is gathering permits", tokensem.ErrNoPermit)
	}
	if err != nil {
		return nil, err
	}
	defer release(g)
	got := make([]tokensem.Permit, 0, k)
	for range k {
		p, err := src.Sem.TryAcquire(ctx)
		if err != nil {
			release(got...)
			return nil, err
		}
		got = append(got, p)
	}
	return tokensem.NewPermitSet(got...), nil
}

// release hands permits back at once, on a context of its own (the
// caller's may be what ended the wait).
func release(permits ...tokensem.Permit) {
	if len(permits) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), tokensem.ReleaseTimeout)
	defer cancel()
	_ = tokensem.NewPermitSet(permits...).Release(ctx)
}

// neverDone stands in for a gate permit whose loss was already seen.
type neverDone struct{ tokensem.Permit }

func (neverDone) Done() <-chan struct{} { return nil }

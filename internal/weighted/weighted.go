// Package weighted gathers several permits of one semaphore for a caller,
// all or nothing, for every backend: the algorithm behind AcquireN and
// TryAcquireN.
//
// Gatherers take turns through a gate: a semaphore of one permit beside the
// semaphore, named driver.GateName(name), created on first use with the same lease
// and key. The holder of the gate issues its k acquires at once; they queue
// with the single-permit waiters in arrival order (by class first: see
// gather), so it holds all k once the waiters queued before it have been
// served. No two gatherers ever hold
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
	"time"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/driver"
	"github.com/tokensem/tokensem/internal/ctxerr"
)

// Host is what a backend semaphore of type T gives the gatherer; its
// AcquireN, TryAcquireN and its inventory's Gate call the methods below.
type Host[T tokensem.Semaphore] struct {
	// Sem is the semaphore whose permits are gathered.
	Sem T
	// Gates holds the semaphore's gate once made or opened.
	Gates *Gate[T]
	// Done is closed by the semaphore's Close.
	Done <-chan struct{}
	// Permits returns the permit count, re-read from the broker when the
	// copy at hand may be stale: a resize can shrink it while a gatherer
	// waits.
	Permits func(ctx context.Context) (int, error)
	// Exists re-reads the semaphore's configuration, failing (with
	// tokensem.ErrNotInitialized) when the semaphore is gone.
	Exists func(ctx context.Context) error
	// MakeGate creates the gate (Init, idempotent); OpenGate opens it,
	// returning tokensem.ErrNotInitialized when there is none.
	MakeGate, OpenGate func(ctx context.Context) (T, error)
	// Inventory returns a gate's inventory for the reconciler.
	Inventory func(T) driver.Inventory
}

// recheckEvery is how often a waiting gatherer re-reads the permit count.
const recheckEvery = time.Second

// check validates k against the permit count.
func (h Host[T]) check(ctx context.Context, k int) error {
	if k < 1 {
		return fmt.Errorf("%w: weight %d (want at least 1)", tokensem.ErrInvalidPermits, k)
	}
	n, err := h.Permits(ctx)
	if err != nil {
		return err
	}
	if k > n {
		return fmt.Errorf("%w: weight %d, permits %d", tokensem.ErrWeightExceedsPermits, k, n)
	}
	return nil
}

// gate returns the gate, made on first use. A non-nil stale is a gate that
// answered ErrNotInitialized (deleted with its semaphore, which was then
// made again): it is forgotten and the gate made afresh, if the semaphore
// itself exists.
func (h Host[T]) gate(ctx context.Context, stale tokensem.Semaphore) (tokensem.Semaphore, error) {
	if stale != nil {
		h.Gates.Forget(stale)
		if err := h.Exists(ctx); err != nil {
			return nil, err
		}
	}
	g, err := h.Gates.Make(ctx, h.Done, h.MakeGate)
	if err != nil {
		return nil, err
	}
	return g, nil
}

// GateInventory returns the inventory of the gate, or nil when no weighted
// caller ever made one.
func (h Host[T]) GateInventory(ctx context.Context) (driver.Inventory, error) {
	g, err := h.Gates.Get(ctx, h.Done, h.OpenGate)
	switch {
	case errors.Is(err, tokensem.ErrNotInitialized):
		return nil, nil
	case err != nil:
		return nil, err
	}
	return h.Inventory(g), nil
}

// Acquire gathers k permits, waiting until ctx ends; then it returns
// ctx.Err() itself.
func (h Host[T]) Acquire(ctx context.Context, k int) (*tokensem.PermitSet, error) {
	set, err := h.take(ctx, k, false)
	return set, ctxerr.Ended(ctx, err)
}

// TryAcquire takes k free permits now, or none. If ctx ends first, it
// returns ctx.Err() itself.
func (h Host[T]) TryAcquire(ctx context.Context, k int) (*tokensem.PermitSet, error) {
	set, err := h.take(ctx, k, true)
	return set, ctxerr.Ended(ctx, err)
}

// take is Acquire (try false) or TryAcquire. Every broker call it makes
// runs under ctx (the configuration read of check, the gate's creation, the
// gate's acquire, the gathering), so when ctx ends any of them may return
// what ctx's end made of it, wrapped by the backend: the callers turn that
// into ctx.Err() (ctxerr.Ended) on the way out.
func (h Host[T]) take(ctx context.Context, k int, try bool) (*tokensem.PermitSet, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := h.check(ctx, k); err != nil {
		return nil, err
	}
	if k == 1 {
		p, err := acquireOne(ctx, h.Sem, try)
		if err != nil {
			return nil, err
		}
		return tokensem.NewPermitSet(p), nil
	}
	gate, err := h.gate(ctx, nil)
	if err != nil {
		return nil, err
	}
	refreshed, remade := false, false
	for {
		g, err := acquireOne(ctx, gate, try)
		switch {
		case errors.Is(err, tokensem.ErrNotInitialized) && !refreshed:
			refreshed = true
			if gate, err = h.gate(ctx, gate); err != nil {
				return nil, err
			}
			continue
		case errors.Is(err, tokensem.ErrPriorityUnsupported) && !remade:
			// A gate made where classes were not served, whose semaphore
			// serves them now: making the gate again (an Init) upgrades
			// it too (natssem).
			remade = true
			if gate, err = h.gate(ctx, gate); err != nil {
				return nil, err
			}
			continue
		case try && errors.Is(err, tokensem.ErrNoPermit):
			return nil, fmt.Errorf("%w: another caller is gathering permits", tokensem.ErrNoPermit)
		case err != nil:
			return nil, err
		}
		var permits []tokensem.Permit
		if try {
			permits, err = h.tryGather(ctx, k)
		} else {
			permits, err = h.gather(ctx, g, k)
		}
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

// acquireOne is s.Acquire, or s.TryAcquire if try.
func acquireOne(ctx context.Context, s tokensem.Semaphore, try bool) (tokensem.Permit, error) {
	if try {
		return s.TryAcquire(ctx)
	}
	return s.Acquire(ctx)
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
//
// The acquires wait in the caller's class, but never below the default
// one (see tokensem.WithPriority): a gatherer holds what it has gathered
// while it waits for the rest, and a low-class gatherer among a steady
// stream of default-class callers would otherwise sit on all but one
// permit for as long as that stream lasts. Callers above the default class
// still go first; the caller waited for the gate in its own class.
func (h Host[T]) gather(ctx context.Context, g tokensem.Permit, k int) ([]tokensem.Permit, error) {
	if p, err := driver.PriorityOf(ctx); err == nil && p < 0 {
		ctx = tokensem.WithPriority(ctx, 0)
	}
	gctx, cancel := context.WithCancel(ctx)
	defer cancel()
	results := make(chan result, k)
	for range k {
		go func() {
			p, err := h.Sem.Acquire(gctx)
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
	gateLost := g.Done()
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
		case <-gateLost:
			fail(errStartOver)
			gateLost = nil // once is enough
		case <-recheck.C:
			if failed == nil {
				if err := h.check(ctx, k); errors.Is(err, tokensem.ErrWeightExceedsPermits) {
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

// tryGather takes k free permits one after the other, or none.
func (h Host[T]) tryGather(ctx context.Context, k int) ([]tokensem.Permit, error) {
	got := make([]tokensem.Permit, 0, k)
	for range k {
		p, err := h.Sem.TryAcquire(ctx)
		if err != nil {
			release(got...)
			return nil, err
		}
		got = append(got, p)
	}
	return got, nil
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

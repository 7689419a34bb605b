package tokensem

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/tokensem/tokensem/internal/ctxerr"
)

// Weighted is a Semaphore whose callers can hold several of its permits at
// once, as x/sync's Weighted does: natssem and amqpsem semaphores are.
//
// AcquireN blocks until the caller holds k permits, all or nothing: it never
// returns holding part of them, and when ctx ends every permit it had
// gathered is handed on at once. Callers of more than one permit take turns
// (a one-permit gate semaphore beside the semaphore serializes them, served
// by class and first come first served within one, see WithPriority), and
// a gatherer's requests queue with the single-permit waiters in arrival
// order (in its class, never below the default one), so two weighted
// callers never
// deadlock each sitting on part of what the other needs, and a caller of k
// = N permits among a stream of single-permit callers gets its permits
// once the callers queued before it have had theirs. k = 1 is Acquire.
// These hold within one semaphore: a caller that holds permits of one
// semaphore while it waits for another's can deadlock with one that does
// the opposite (use AcquireAll for one permit of each), and on NATS a wait
// longer than the pull expiry (natssem.DefaultPullExpiry) re-queues its
// requests at the back, as it does a single caller's.
//
// TryAcquireN takes k permits if they are free now (and no other caller is
// gathering), or returns ErrNoPermit at once, holding nothing.
//
// If ctx ends before they return, both return ctx.Err() itself (err ==
// context.Canceled holds), wherever the call was: reading the semaphore's
// configuration, creating or opening the gate, queued for it, or gathering.
// AcquireN returns once it has handed back what it had gathered and the
// gate: within about two broker round trips of ctx's end (the hand-back is
// bounded by ReleaseTimeout).
//
// Both return ErrInvalidPermits for k < 1 and ErrWeightExceedsPermits for
// k above the semaphore's permits, at once; a resize that shrinks the
// semaphore below k while a caller waits ends the wait with
// ErrWeightExceedsPermits. Each permit of the set has its own slot and fence
// (PermitSet.Tokens, PermitSet.Fences); the loss of one is the loss of the
// set.
type Weighted interface {
	Semaphore
	AcquireN(ctx context.Context, k int) (*PermitSet, error)
	TryAcquireN(ctx context.Context, k int) (*PermitSet, error)
}

// named is what AcquireAll needs to order semaphores: natssem and amqpsem
// semaphores have a Name.
type named interface {
	Name() string
}

// AcquireAll holds one permit of each of sems at once — a regional and a
// global limit, say, possibly on different brokers — all or nothing. It
// acquires them one at a time in one canonical order whatever order they
// are given in (by name, then by kind of broker), so no two callers of
// AcquireAll can deadlock each holding what the other waits for. If ctx
// ends or an acquire fails, the permits taken so far are handed back at
// once and the error is returned: ctx.Err() itself if ctx ended, else the
// acquire's error prefixed with the semaphore's name. The set holds the
// permits in the order sems were given; while it is held, every permit of
// it is held (the exact mode of a hierarchy: a caller counts against every
// level for its whole hold).
//
// Every semaphore must have a Name method (natssem's and amqpsem's do) and
// the pairs (kind of broker, name) must be distinct: the same semaphore
// twice, or two semaphores of one name on two brokers of the same kind,
// return ErrAmbiguousOrder, because processes could order them
// differently. Other errors are those of Acquire.
func AcquireAll(ctx context.Context, sems ...Semaphore) (*PermitSet, error) {
	return acquireAll(ctx, sems, Semaphore.Acquire)
}

// TryAcquireAll is AcquireAll without waiting: it takes one permit of each
// of sems if each has one free now, or returns ErrNoPermit holding nothing.
func TryAcquireAll(ctx context.Context, sems ...Semaphore) (*PermitSet, error) {
	return acquireAll(ctx, sems, Semaphore.TryAcquire)
}

func acquireAll(ctx context.Context, sems []Semaphore, acquire func(Semaphore, context.Context) (Permit, error)) (*PermitSet, error) {
	order, err := canonicalOrder(sems)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for {
		held := make([]Permit, len(sems))
		for _, i := range order {
			p, err := acquire(sems[i], ctx)
			if err != nil {
				giveBack(held)
				if ctxerr.Caused(ctx, err) {
					return nil, ctx.Err()
				}
				return nil, fmt.Errorf("%s: %w", sems[i].(named).Name(), err)
			}
			held[i] = p
		}
		set := NewPermitSet(held...)
		// A permit taken early may have been lost while a later one was
		// awaited: such a set is worth nothing; start over.
		if allHeld(held) {
			return set, nil
		}
		rctx, cancel := context.WithTimeout(context.Background(), ReleaseTimeout)
		_ = set.Release(rctx)
		cancel()
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
}

// allHeld reports whether no permit of held is lost or released.
func allHeld(held []Permit) bool {
	for _, p := range held {
		if p.Err() != nil {
			return false
		}
	}
	return true
}

// canonicalOrder returns the indices of sems in the order every process
// acquires them in.
func canonicalOrder(sems []Semaphore) ([]int, error) {
	if len(sems) == 0 {
		return nil, fmt.Errorf("%w: no semaphores", ErrInvalidOption)
	}
	type key struct{ name, kind string }
	keys := make([]key, len(sems))
	for i, s := range sems {
		n, ok := s.(named)
		if !ok || s == nil {
			return nil, fmt.Errorf("%w: semaphore %d (%T) has no Name method", ErrAmbiguousOrder, i+1, s)
		}
		keys[i] = key{n.Name(), fmt.Sprintf("%T", s)}
	}
	order := make([]int, len(sems))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		return cmp.Or(cmp.Compare(keys[a].name, keys[b].name), cmp.Compare(keys[a].kind, keys[b].kind))
	})
	for j := 1; j < len(order); j++ {
		if a, b := order[j-1], order[j]; keys[a] == keys[b] {
			return nil, fmt.Errorf("%w: semaphores %d and %d are both %q on the same kind of broker: give them distinct names",
				ErrAmbiguousOrder, a+1, b+1, keys[a].name)
		}
	}
	return order, nil
}

// giveBack releases the permits taken so far (nil entries are skipped) at
// once, on a context of its own: the caller's may be what ended the wait.
func giveBack(held []Permit) {
	var some []Permit
	for _, p := range held {
		if p != nil {
			some = append(some, p)
		}
	}
	if len(some) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), ReleaseTimeout)
	defer cancel()
	ps := NewPermitSet(some...)
	_ = ps.Release(ctx)
}

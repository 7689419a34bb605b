package tokensem

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// PermitSet is several permits held as one: k permits of one semaphore
// (a backend's AcquireN) or one permit of each of several semaphores
// (AcquireAll). They were taken all or nothing, they are lost together and
// released together:
//
//   - Done closes when the set is released or when any one of its permits
//     is lost; then Err wraps ErrLeaseLost with that permit's cause.
//   - When one permit is lost, the set hands its other permits back at once
//     (they are worth nothing without it), so a caller that stops at Done
//     strands no permit even if it never calls Release.
//   - Release returns every permit; a second call returns ErrReleased, a
//     call after a loss returns the loss and touches nothing more.
//
// Each permit keeps its own token and fence: Tokens and Fences give them in
// the set's order, so a protected resource can check every slot it is
// handed. A PermitSet owns one goroutine per permit until it is released or
// lost; it is safe for concurrent use.
type PermitSet struct {
	permits []Permit
	done    chan struct{}
	stop    chan struct{} // closed when the set stops watching its permits
	wg      sync.WaitGroup

	mu    sync.Mutex
	phase setPhase
	err   error
}

type setPhase int

const (
	setHeld setPhase = iota
	setReleasing
	setReleased
	setLost
)

// NewPermitSet bundles held permits into one PermitSet, in the order given.
// From then on the set owns them: release them through the set. It panics
// if a permit is nil; an empty set is held until released.
func NewPermitSet(permits ...Permit) *PermitSet {
	ps := &PermitSet{
		permits: append([]Permit(nil), permits...),
		done:    make(chan struct{}),
		stop:    make(chan struct{}),
	}
	for i, p := range ps.permits {
		if p == nil {
			panic(fmt.Sprintf("tokensem: NewPermitSet: permit %d is nil", i))
		}
		ps.wg.Add(1)
		go ps.watch(i, p)
	}
	return ps
}

// watch waits for permit i to end; an end the set did not ask for is the
// loss of the whole set.
func (ps *PermitSet) watch(i int, p Permit) {
	defer ps.wg.Done()
	select {
	case <-p.Done():
	case <-ps.stop:
		return
	}
	ps.lose(i, p)
}

// lose marks the set lost because permit i ended, and hands the others
// back. Only the first loss while held counts; a permit that ends because
// the set is releasing it is no loss.
func (ps *PermitSet) lose(i int, p Permit) {
	ps.mu.Lock()
	if ps.phase != setHeld {
		ps.mu.Unlock()
		return
	}
	cause := p.Err()
	if cause == nil || errors.Is(cause, ErrReleased) {
		cause = fmt.Errorf("%w: released on its own", ErrLeaseLost)
	}
	ps.phase = setLost
	ps.err = ps.which(i, cause)
	close(ps.stop)
	close(ps.done)
	ps.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), ReleaseTimeout)
	defer cancel()
	ps.releaseAll(ctx, i)
}

// releaseAll releases every permit but skip (-1: none) at once and joins
// their errors; a permit that was already released is no error.
func (ps *PermitSet) releaseAll(ctx context.Context, skip int) error {
	errs := make([]error, len(ps.permits))
	var wg sync.WaitGroup
	for i, p := range ps.permits {
		if i == skip {
			continue
		}
		wg.Go(func() {
			if err := p.Release(ctx); err != nil && !errors.Is(err, ErrReleased) {
				errs[i] = ps.which(i, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// ReportUse records how the holder's use of the set went on each of its
// permits (see ReportUse): a use of k permits at once is k uses.
func (ps *PermitSet) ReportUse(took time.Duration, overloaded bool) {
	for _, p := range ps.permits {
		ReportUse(p, took, overloaded)
	}
}

// Permits returns the permits of the set in its order. They belong to the
// set: read them, do not release them one by one (that loses the set).
func (ps *PermitSet) Permits() []Permit { return append([]Permit(nil), ps.permits...) }

// Len is the number of permits in the set.
func (ps *PermitSet) Len() int { return len(ps.permits) }

// Tokens returns the tokens of the set's permits, in its order.
func (ps *PermitSet) Tokens() []Token {
	toks := make([]Token, len(ps.permits))
	for i, p := range ps.permits {
		toks[i] = p.Token()
	}
	return toks
}

// Fences returns the fencing numbers of the set's permits, in its order:
// each is the fence of its own slot (see Permit.Fence).
func (ps *PermitSet) Fences() []uint64 {
	fences := make([]uint64, len(ps.permits))
	for i, p := range ps.permits {
		fences[i] = p.Fence()
	}
	return fences
}

// Deadline returns the earliest deadline of the set's permits that have
// one (see Permit.Deadline), or the zero time if none has.
func (ps *PermitSet) Deadline() time.Time {
	var first time.Time
	for _, p := range ps.permits {
		if t := p.Deadline(); !t.IsZero() && (first.IsZero() || t.Before(first)) {
			first = t
		}
	}
	return first
}

// Done is closed when the set is released or any of its permits is lost.
func (ps *PermitSet) Done() <-chan struct{} { return ps.done }

// Err is nil while every permit is held, wraps ErrLeaseLost (naming the
// permit and its cause) after a loss, and is ErrReleased after a
// successful Release.
func (ps *PermitSet) Err() error {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.err
}

// Release returns every permit of the set, all at once, each bounded by
// ctx. A second call returns ErrReleased. After a loss it returns the loss
// (wrapping ErrLeaseLost) once the set has handed its other permits back
// (or ctx ends). If a permit turns out lost as it is released, Release
// returns that loss and still returns the others.
func (ps *PermitSet) Release(ctx context.Context) error {
	ps.mu.Lock()
	switch ps.phase {
	case setReleasing, setReleased:
		ps.mu.Unlock()
		return ErrReleased
	case setLost:
		err := ps.err
		ps.mu.Unlock()
		ps.waitWatchers(ctx)
		return err
	}
	ps.phase = setReleasing
	close(ps.stop)
	ps.mu.Unlock()

	ps.wg.Wait() // the watchers see stop, or a loss they may no longer report
	err := ps.releaseAll(ctx, -1)

	ps.mu.Lock()
	ps.phase = setReleased
	ps.err = ErrReleased
	if err != nil {
		ps.err = err
	}
	close(ps.done)
	ps.mu.Unlock()
	return err
}

// waitWatchers waits until the watchers (and the hand-back after a loss)
// are done, or ctx ends.
func (ps *PermitSet) waitWatchers(ctx context.Context) {
	finished := make(chan struct{})
	go func() {
		ps.wg.Wait()
		close(finished)
	}()
	select {
	case <-finished:
	case <-ctx.Done():
	}
}

// which says which permit of the set err is about: the permit's own
// errors name its semaphore and slot, so a set of one adds nothing.
func (ps *PermitSet) which(i int, err error) error {
	if len(ps.permits) == 1 {
		return err
	}
	p := ps.permits[i]
	return fmt.Errorf("permit %d of %d (slot %d of %s): %w", i+1, len(ps.permits), p.Token().Index, p.Token().Semaphore, err)
}

package reconciler

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/driver"
	"github.com/tokensem/tokensem/internal/backoff"
)

// Report is the outcome of one reconciliation.
type Report struct {
	Permits    int           `json:"permits"`
	Tokens     int           `json:"tokens"`     // messages found
	Duplicates []int         `json:"duplicates"` // indices with more than one valid token
	Missing    []int         `json:"missing"`    // indices proven absent
	Invalid    int           `json:"invalid"`    // junk, forged, foreign or retired
	Removed    int           `json:"removed"`    // messages removed by the repair
	Issued     int           `json:"issued"`     // tokens issued by the repair
	Conflicts  int           `json:"conflicts"`  // issues skipped because the slot changed
	Healthy    bool          `json:"healthy"`    // after the run
	Census     time.Duration `json:"census_ns"`  // time of the (first) census
	Repair     time.Duration `json:"repair_ns"`  // time of the repair
	// Problems are the driver.Census Problems of the census Healthy was judged
	// by: what makes the semaphore unhealthy that no repair here fixes.
	Problems []string `json:"problems,omitempty"`
	// Gate is the run on the semaphore's gate (see driver.Gated), if it has one;
	// Healthy above counts it too.
	Gate *Report `json:"gate,omitempty"`
}

// Run takes a census and, if repair is set, repairs what it found, then
// takes a second census to report the outcome. A driver.Gated inventory's gate is
// reconciled the same way afterwards (Report.Gate).
func Run(ctx context.Context, inv driver.Inventory, repair bool) (Report, error) {
	r, err := run(ctx, inv, repair)
	g, ok := inv.(driver.Gated)
	if err != nil || !ok {
		return r, err
	}
	gate, err := g.Gate(ctx)
	if err != nil {
		return r, fmt.Errorf("reconciler: looking up the gate: %w", err)
	}
	if gate == nil {
		return r, nil
	}
	gr, err := run(ctx, gate, repair)
	if err != nil {
		return r, fmt.Errorf("reconciler: gate: %w", err)
	}
	r.Gate = &gr
	r.Healthy = r.Healthy && gr.Healthy
	return r, nil
}

// RunWithoutGate is Run for inv's semaphore alone, leaving a driver.Gated
// inventory's gate as it is: for runs that concern the semaphore's permits
// only (a resize, a waiter's repair of orphaned tokens), which a failed gate
// lookup must not fail.
func RunWithoutGate(ctx context.Context, inv driver.Inventory, repair bool) (Report, error) {
	return run(ctx, inv, repair)
}

// Resize is a backend's Resize: it checks permits, has write store the new
// count (under the backend's admin lock, so that no reconcile run sees it
// change halfway through), and repairs the token set to match: growing
// issues tokens for the new slots; shrinking removes the ready tokens of
// slots >= permits, while their holders keep their permits until they
// release. The gate, which has one permit whatever the count, is left
// alone (RunWithoutGate).
func Resize(ctx context.Context, inv driver.Inventory, permits int, write func(ctx context.Context, permits int) error) (Report, error) {
	if err := tokensem.ValidatePermits(permits); err != nil {
		return Report{}, err
	}
	if err := write(ctx, permits); err != nil {
		return Report{}, err
	}
	return RunWithoutGate(ctx, inv, true)
}

func run(ctx context.Context, inv driver.Inventory, repair bool) (Report, error) {
	unlock, err := inv.Lock(ctx)
	if err != nil {
		return Report{}, err
	}
	defer unlock()
	t0 := time.Now()
	c, err := inv.Census(ctx)
	if err != nil {
		return Report{}, err
	}
	f := driver.Analyze(c)
	r := Report{
		Permits: c.Permits, Tokens: len(c.Entries), Duplicates: f.DuplicateIndices(),
		Missing: append([]int{}, f.Missing...), Invalid: len(f.Invalid), Census: time.Since(t0),
		Healthy: f.Healthy(c), Problems: c.Problems,
	}
	if !repair || r.Healthy {
		return r, nil
	}
	t1 := time.Now()
	for _, e := range f.Invalid {
		if err := inv.Remove(ctx, e); err != nil {
			return r, fmt.Errorf("reconciler: remove invalid %s: %w", e.Ref, err)
		}
		r.Removed++
	}
	heldSlot := make(map[int]bool, len(c.HeldSlots))
	for _, i := range c.HeldSlots {
		heldSlot[i] = true
	}
	for _, i := range r.Duplicates {
		for _, e := range surplus(f.Duplicates[i], c.HeldUnseen && heldSlot[i]) {
			if err := inv.Remove(ctx, e); err != nil {
				return r, fmt.Errorf("reconciler: remove duplicate %s of slot %d: %w", e.Ref, i, err)
			}
			r.Removed++
		}
	}
	for _, i := range f.Missing {
		switch err := inv.Issue(ctx, i); {
		case err == nil:
			r.Issued++
		case errors.Is(err, driver.ErrConflict):
			r.Conflicts++
		default:
			return r, fmt.Errorf("reconciler: issue slot %d: %w", i, err)
		}
	}
	r.Repair = time.Since(t1)
	// A replicated broker may answer the census from a replica that has
	// not applied the repair yet (natssem reads tokens with direct gets,
	// which any replica serves: docs/nats-cluster-facts.md), so a repair
	// that leaves the census unhealthy is counted again a few times, for up
	// to about half a second, before the report says so.
	pause := backoff.Backoff{Min: 20 * time.Millisecond, Max: 160 * time.Millisecond}
	for try := 0; ; try++ {
		after, err := inv.Census(ctx)
		if err != nil {
			return r, err
		}
		r.Healthy, r.Problems = driver.Analyze(after).Healthy(after), after.Problems
		if r.Healthy || try == afterRepairRecounts || r.Removed+r.Issued == 0 {
			return r, nil
		}
		if err := pause.Wait(ctx, nil); err != nil {
			return r, err
		}
	}
}

// afterRepairRecounts bounds how many times run counts again a census that
// a repair left unhealthy.
const afterRepairRecounts = 4

// surplus returns the copies of one slot to remove: all but the held one,
// or all but the first when none is held; all of them when the slot's held
// token is unseen.
func surplus(es []driver.Entry, heldUnseen bool) []driver.Entry {
	if heldUnseen {
		return es
	}
	keep := 0
	for i, e := range es {
		if e.Held {
			keep = i
			break
		}
	}
	out := make([]driver.Entry, 0, len(es)-1)
	for i, e := range es {
		if i != keep {
			out = append(out, e)
		}
	}
	return out
}

// Watch runs Run every interval until ctx ends, handing each report (or
// error) to report; a failed run is reported and retried at the next tick.
// It returns ctx.Err(). Run it in a goroutine you own.
func Watch(ctx context.Context, inv driver.Inventory, interval time.Duration, repair bool, report func(Report, error)) error {
	if interval <= 0 {
		return fmt.Errorf("reconciler: watch interval %v must be positive", interval)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		r, err := Run(ctx, inv, repair)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		report(r, err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

package semtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tokensem/tokensem"
)

// A wait that ends because its context ended returns ctx.Err() itself, not
// an error wrapping it: x/sync-style callers test err == context.Canceled.
// This holds for every entry point that waits or talks to the broker
// (Acquire, AcquireN, TryAcquireN, AcquireAll, Do), for one permit and for
// several, for a cancel and for a deadline, whenever the context ends:
// before the call, while the call waits in the queue, while it holds part
// of its weight, while it waits for the gate, or at any moment in between
// (a configuration read, the gate's creation, a claim). Afterwards every
// permit is free again.

// lateBound bounds how late after its context's deadline a call returns,
// as the suite asserts it: loosely, so that a loaded machine does not make
// it flake. docs/guarantees.md gives what was measured (tens of
// milliseconds).
const lateBound = 2 * time.Second

// cancelEntry is one entry point under test.
type cancelEntry struct {
	name string
	k    int  // permits the call asks for (of its first semaphore)
	wait bool // false: the call never waits for a permit (TryAcquireN)
	// all: the call takes one permit of each of two semaphores (AcquireAll).
	all bool
	// call runs the entry point on s (and other, for AcquireAll). A
	// success is handed back with release.
	call func(ctx context.Context, s, other tokensem.Semaphore) (release func(), err error)
}

// cancelEntries are the entry points under test.
func cancelEntries() []cancelEntry {
	set := func(ps *tokensem.PermitSet, err error) (func(), error) {
		if err != nil {
			return nil, err
		}
		return func() { _ = ps.Release(context.Background()) }, nil
	}
	one := func(p tokensem.Permit, err error) (func(), error) {
		if err != nil {
			return nil, err
		}
		return func() { _ = p.Release(context.Background()) }, nil
	}
	acquireN := func(k int) func(context.Context, tokensem.Semaphore, tokensem.Semaphore) (func(), error) {
		return func(ctx context.Context, s, _ tokensem.Semaphore) (func(), error) {
			return set(s.(tokensem.Weighted).AcquireN(ctx, k))
		}
	}
	tryAcquireN := func(k int) func(context.Context, tokensem.Semaphore, tokensem.Semaphore) (func(), error) {
		return func(ctx context.Context, s, _ tokensem.Semaphore) (func(), error) {
			return set(s.(tokensem.Weighted).TryAcquireN(ctx, k))
		}
	}
	do := func(k int) func(context.Context, tokensem.Semaphore, tokensem.Semaphore) (func(), error) {
		return func(ctx context.Context, s, _ tokensem.Semaphore) (func(), error) {
			// fn may run only in the sweep, where a permit may come in
			// time; Do releases it itself.
			return func() {}, tokensem.Do(ctx, s, func(context.Context) error { return nil }, tokensem.WithWeight(k))
		}
	}
	return []cancelEntry{
		{name: "Acquire", k: 1, wait: true, call: func(ctx context.Context, s, _ tokensem.Semaphore) (func(), error) {
			return one(s.Acquire(ctx))
		}},
		{name: "AcquireN1", k: 1, wait: true, call: acquireN(1)},
		{name: "AcquireN3", k: 3, wait: true, call: acquireN(3)},
		{name: "TryAcquireN1", k: 1, call: tryAcquireN(1)},
		{name: "TryAcquireN3", k: 3, call: tryAcquireN(3)},
		{name: "AcquireAll", k: 1, wait: true, all: true, call: func(ctx context.Context, s, other tokensem.Semaphore) (func(), error) {
			return set(tokensem.AcquireAll(ctx, s, other))
		}},
		{name: "Do1", k: 1, wait: true, call: do(1)},
		{name: "Do3", k: 3, wait: true, call: do(3)},
	}
}

// cancelCause is how a context ends: a cancel, or its deadline.
type cancelCause struct {
	name string
	want error
}

var cancelCauses = []cancelCause{{"Canceled", context.Canceled}, {"DeadlineExceeded", context.DeadlineExceeded}}

// cancelPermits is the size of the semaphores under test; the weighted
// entries ask for 3 of them.
const cancelPermits = 4

// cancelFixture is one entry point's semaphores: the holder's client, the
// caller's client (a connection of its own), and for AcquireAll a second
// semaphore of cancelPermits.
type cancelFixture struct {
	b              Backend
	e              cancelEntry
	holder, caller tokensem.Semaphore
	// first and second are the holder's clients of the semaphores in the
	// order AcquireAll takes them; for the others first is holder and
	// second nil.
	first, second tokensem.Semaphore
	callerOther   tokensem.Semaphore // the caller's client of the second semaphore
	otherHolder   tokensem.Semaphore
	sn            string // the name of the semaphore of holder and caller
}

func newCancelFixture(t *testing.T, b Backend, e cancelEntry) *cancelFixture {
	t.Helper()
	f := &cancelFixture{b: b, e: e, sn: uniqueName(t)}
	f.holder = mustInit(t, b, f.sn, cancelPermits, Options{Lease: 60 * time.Second})
	f.caller = mustOpen(t, b, b.Addr, f.sn, Options{})
	f.first = f.holder
	if e.all {
		on := uniqueName(t)
		f.otherHolder = mustInit(t, b, on, cancelPermits, Options{Lease: 60 * time.Second})
		f.callerOther = mustOpen(t, b, b.Addr, on, Options{})
		f.first, f.second = f.holder, f.otherHolder
		if on < f.sn { // AcquireAll takes them by name
			f.first, f.second = f.otherHolder, f.holder
		}
	}
	if e.k > 1 {
		// Make the caller's gate now, so that a short deadline finds the
		// call waiting rather than creating it (the sweep covers that).
		ps, err := weightedOf(t, f.caller).AcquireN(Context(t, 20*time.Second), e.k)
		if err != nil {
			t.Fatalf("warming the gate: %v", err)
		}
		if err := ps.Release(t.Context()); err != nil {
			t.Fatalf("warming the gate: %v", err)
		}
	}
	return f
}

// call runs the entry point on the caller's clients.
func (f *cancelFixture) call(ctx context.Context) (func(), error) {
	return f.e.call(ctx, f.caller, f.callerOther)
}

// allFree checks that every permit of the fixture's semaphores, and the
// gate of a weighted one, is free again: nothing the failed calls took
// stays taken.
func (f *cancelFixture) allFree(t *testing.T) {
	t.Helper()
	checkFree(t, f.holder, f.e.k > 1)
	if f.otherHolder != nil {
		checkFree(t, f.otherHolder, false)
	}
}

// checkFree waits until every permit of s is free (and its gate, if gate).
func checkFree(t *testing.T, s tokensem.Semaphore, gate bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var err error
		if gate {
			var ps *tokensem.PermitSet
			if ps, err = weightedOf(t, s).TryAcquireN(Context(t, 5*time.Second), cancelPermits); err == nil {
				if err = ps.Release(t.Context()); err == nil {
					return
				}
			}
		} else {
			ps := drainAll(t, s, cancelPermits)
			releaseAll(t, ps)
			if len(ps) == cancelPermits {
				return
			}
			err = fmt.Errorf("%d permits free", len(ps))
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not all %d permits free after 20 s: %v; status %+v",
				s.(interface{ Name() string }).Name(), cancelPermits, err, status(t, s))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// endingContext returns a context that ends by cause: at once if now, else
// after d (a deadline) or when end is called (a cancel, which the test
// calls once the call waits where it should).
func endingContext(t *testing.T, c cancelCause, now bool, d time.Duration) (ctx context.Context, end func()) {
	t.Helper()
	base := Context(t, time.Minute)
	switch {
	case c.want == context.Canceled:
		ctx, cancel := context.WithCancel(base)
		t.Cleanup(cancel)
		if now {
			cancel()
		}
		return ctx, cancel
	case now:
		ctx, cancel := context.WithDeadline(base, time.Now().Add(-time.Second))
		t.Cleanup(cancel)
		return ctx, func() {}
	}
	ctx, cancel := context.WithTimeout(base, d)
	t.Cleanup(cancel)
	return ctx, func() {}
}

// checkCtxErr fails the test unless err is ctx.Err() itself.
func checkCtxErr(t *testing.T, what string, ctx context.Context, err error) {
	t.Helper()
	if ctx.Err() == nil {
		t.Fatalf("%s returned %v before its context ended", what, err)
	}
	if err != ctx.Err() {
		t.Errorf("%s: err = %q (%T), want ctx.Err() itself (%v)", what, err, err, ctx.Err())
	}
}

// waitDeadline is the deadline of the calls that must be waiting when it
// passes, as the callers had it.
const waitDeadline = 250 * time.Millisecond

// testCancelReturnsCtxErr runs every entry point against every way its
// context can end.
// Each entry point and each sweep works on semaphores of its own, so they
// run side by side.
func testCancelReturnsCtxErr(t *testing.T, b Backend) {
	var cases []subtest
	for _, e := range cancelEntries() {
		cases = append(cases, subtest{e.name, func(t *testing.T) {
			for _, c := range cancelCauses {
				t.Run(c.name, func(t *testing.T) { cancelMoments(t, b, e, c) })
			}
		}})
	}
	for _, c := range cancelCauses {
		cases = append(cases, subtest{"Sweep/" + c.name, func(t *testing.T) { cancelSweep(t, b, c) }})
	}
	runSideBySide(t, cases)
}

// cancelMoments ends the context of one entry point at each moment that
// can be told apart from outside: before the call, while it is queued,
// while it holds part of its permits, and while it waits for the gate.
func cancelMoments(t *testing.T, b Backend, e cancelEntry, c cancelCause) {
	f := newCancelFixture(t, b, e)

	t.Run("Before", func(t *testing.T) {
		ctx, _ := endingContext(t, c, true, 0)
		release, err := f.call(ctx)
		if err == nil {
			release()
			t.Fatalf("%s with a done context succeeded", e.name)
		}
		checkCtxErr(t, e.name+" with a done context", ctx, err)
		f.allFree(t)
	})
	if !e.wait {
		return
	}

	// Queued: every permit (of the first semaphore AcquireAll takes) held.
	t.Run("Queued", func(t *testing.T) {
		held := takeAll(t, f.first, cancelPermits)
		f.waitEnded(t, c, e.name+" queued", func() bool { return status(t, f.first).Waiting >= 1 })
		releaseAll(t, held)
		f.allFree(t)
	})

	// Gathering: the call holds part of what it asks for (k-1 of its
	// permits, or AcquireAll's first semaphore) and waits for the rest.
	if e.k > 1 || e.all {
		t.Run("Gathering", func(t *testing.T) {
			var held []tokensem.Permit
			var gathering func() bool
			if e.all {
				held = takeAll(t, f.second, cancelPermits)
				gathering = func() bool { return status(t, f.second).Waiting >= 1 && status(t, f.first).Held == 1 }
			} else {
				held = takeAll(t, f.first, cancelPermits-(e.k-1))
				gathering = func() bool { st := status(t, f.first); return st.Held == cancelPermits && st.Waiting >= 1 }
			}
			f.waitEnded(t, c, e.name+" gathering", gathering)
			releaseAll(t, held)
			f.allFree(t)
		})
	}

	// Gate: another gatherer holds the gate and waits; the call waits for
	// the gate. Nothing outside tells that the call has reached the gate's
	// queue, so a cancel comes a while after the call starts.
	if e.k > 1 {
		t.Run("Gate", func(t *testing.T) {
			held := takeAll(t, f.first, cancelPermits)
			other := weightedOf(t, mustOpen(t, b, b.Addr, f.sn, Options{}))
			octx, ocancel := context.WithCancel(Context(t, time.Minute))
			defer ocancel()
			odone := make(chan error, 1)
			go func() {
				ps, err := other.AcquireN(octx, e.k)
				if err == nil {
					_ = ps.Release(context.Background())
				}
				odone <- err
			}()
			eventually(t, 20*time.Second, "the other gatherer waiting", func() bool { return status(t, f.first).Waiting >= e.k })
			start := time.Now()
			f.waitEnded(t, c, e.name+" behind the gate", func() bool { return time.Since(start) > 300*time.Millisecond })
			ocancel()
			checkCtxErr(t, "the other gatherer", octx, <-odone)
			releaseAll(t, held)
			f.allFree(t)
		})
	}
}

// waitEnded calls the entry point with a context that ends by cause c
// once waiting holds (a cancel) or at waitDeadline (a deadline), and
// checks that it returns ctx.Err() itself within lateBound of a deadline.
func (f *cancelFixture) waitEnded(t *testing.T, c cancelCause, what string, waiting func() bool) {
	t.Helper()
	ctx, end := endingContext(t, c, false, waitDeadline)
	type outcome struct {
		release func()
		err     error
		at      time.Time
	}
	done := make(chan outcome, 1)
	go func() {
		release, err := f.call(ctx)
		done <- outcome{release, err, time.Now()}
	}()
	if c.want == context.Canceled {
		eventually(t, 20*time.Second, what, waiting)
		end()
	}
	o := <-done
	if o.err == nil {
		o.release()
		t.Fatalf("%s: succeeded, although no permit was free", what)
	}
	checkCtxErr(t, what, ctx, o.err)
	if d, ok := ctx.Deadline(); ok && c.want == context.DeadlineExceeded {
		late := o.at.Sub(d)
		t.Logf("%s: returned %v after its deadline", what, late.Round(time.Millisecond))
		if late > lateBound {
			t.Errorf("%s: returned %v after its deadline, more than %v", what, late, lateBound)
		}
	}
}

// sweepDelays are the moments after the call's start at which the sweep's
// contexts end: spread from at once to well past a configuration read and
// a gate's creation.
var sweepDelays = []time.Duration{
	0, 500 * time.Microsecond, time.Millisecond, 2 * time.Millisecond, 3 * time.Millisecond,
	5 * time.Millisecond, 8 * time.Millisecond, 12 * time.Millisecond, 20 * time.Millisecond,
	30 * time.Millisecond, 50 * time.Millisecond, 80 * time.Millisecond, 120 * time.Millisecond,
	200 * time.Millisecond, 350 * time.Millisecond,
}

// staleAfter is how long a client must be idle before its next acquire
// re-reads the semaphore's configuration (both backends' configTTL, with a
// margin).
const staleAfter = 2500 * time.Millisecond

// cancelSweep ends the contexts of many calls, on fresh clients whose
// configuration is stale and who have no gate yet, at moments spread over
// the call, so that some end while the configuration is read, some while
// the gate is made, some while a token is claimed or permits are gathered.
// Half the permits are free: a call may also succeed, and is released.
// Every call that fails returns ctx.Err() itself.
func cancelSweep(t *testing.T, b Backend, c cancelCause) {
	sn, on := uniqueName(t), uniqueName(t)
	holder := mustInit(t, b, sn, cancelPermits, Options{Lease: 60 * time.Second})
	otherHolder := mustInit(t, b, on, cancelPermits, Options{Lease: 60 * time.Second})
	held := takeAll(t, holder, cancelPermits/2)

	type run struct {
		e      cancelEntry
		d      time.Duration
		s, o   tokensem.Semaphore
		result error
		ctx    context.Context
		at     time.Time // when the call returned
	}
	var runs []*run
	entries := cancelEntries()
	for i, d := range slices.Repeat(sweepDelays, 2) {
		e := entries[i%len(entries)]
		r := &run{e: e, d: d, s: mustOpen(t, b, b.Addr, sn, Options{})}
		if e.all {
			r.o = mustOpen(t, b, b.Addr, on, Options{})
		}
		runs = append(runs, r)
	}
	time.Sleep(staleAfter)

	var wg sync.WaitGroup
	for _, r := range runs {
		var end func()
		r.ctx, end = endingContext(t, c, false, r.d)
		wg.Go(func() {
			if c.want == context.Canceled {
				time.AfterFunc(r.d, end)
			}
			release, err := r.e.call(r.ctx, r.s, r.o)
			if err == nil {
				release()
			}
			r.result, r.at = err, time.Now()
		})
	}
	wg.Wait()
	failed := 0
	var latest time.Duration
	for _, r := range runs {
		if r.result == nil {
			continue
		}
		failed++
		if d, ok := r.ctx.Deadline(); ok && c.want == context.DeadlineExceeded && r.d > 0 {
			late := r.at.Sub(d)
			latest = max(latest, late)
			if late > lateBound {
				t.Errorf("%s with a deadline of %v returned %v after it, more than %v", r.e.name, r.d, late, lateBound)
			}
		}
		if !r.e.wait && errors.Is(r.result, tokensem.ErrNoPermit) {
			continue // a try that found no permit free, before or as its context ended
		}
		if r.result != r.ctx.Err() {
			t.Errorf("%s ended after %v: err = %q (%T), want ctx.Err() itself (%v)", r.e.name, r.d, r.result, r.result, r.ctx.Err())
		}
	}
	t.Logf("%d of %d calls failed; the latest returned %v after its deadline", failed, len(runs), latest.Round(time.Millisecond))
	releaseAll(t, held)
	checkFree(t, holder, true)
	checkFree(t, otherHolder, false)
}

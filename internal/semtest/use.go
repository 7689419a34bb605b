package semtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/adaptive"
)

// events records the ending events of semaphore name and hands every
// event on.
type events struct {
	name string
	mu   sync.Mutex
	ends []tokensem.Event // EventRelease, EventLost
	next tokensem.Observer
}

func (e *events) Observe(ev tokensem.Event) {
	if ev.Semaphore == e.name && (ev.Kind == tokensem.EventRelease || ev.Kind == tokensem.EventLost) {
		e.mu.Lock()
		e.ends = append(e.ends, ev)
		e.mu.Unlock()
	}
	e.next.Observe(ev)
}

// take returns the ending events recorded since the last take.
func (e *events) take() []tokensem.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := e.ends
	e.ends = nil
	return out
}

// testUseReports: how holders say their use of a permit went reaches the
// semaphore's Observer on the event that ends the permit, in this process
// (no broker round trip): Do measures fn and reports an error wrapping
// ErrOverload as overloaded; ReportUse on a permit, or on a weighted
// caller's PermitSet, replaces the measure; a permit without a report
// reports how long it was held. An adaptive.Window sums the reports into
// the window's sample.
func testUseReports(t *testing.T, b Backend) {
	name := uniqueName(t)
	w := adaptive.NewWindow(name)
	ev := &events{name: name, next: w}
	s := mustInit(t, b, name, 3, Options{Observer: ev})
	ctx := Context(t, 30*time.Second)
	one := func(what string) tokensem.Event {
		t.Helper()
		got := ev.take()
		if len(got) != 1 || got[0].Kind != tokensem.EventRelease {
			t.Fatalf("%s: ending events %+v, want one release", what, got)
		}
		return got[0]
	}

	// Do, fn fine and fn overloaded. Do measures fn alone: less than the
	// hold, which began before and ends after the release.
	if err := tokensem.Do(ctx, s, func(context.Context) error { time.Sleep(30 * time.Millisecond); return nil }); err != nil {
		t.Fatal(err)
	}
	if e := one("Do"); e.Use < 30*time.Millisecond || e.Use >= e.Held || e.Overload || !e.Reported {
		t.Errorf("Do of a 30 ms fn reported use %v (held %v), overload %v, reported %v", e.Use, e.Held, e.Overload, e.Reported)
	}
	refused := fmt.Errorf("downstream said 503: %w", tokensem.ErrOverload)
	if err := tokensem.Do(ctx, s, func(context.Context) error { return refused }); !errors.Is(err, tokensem.ErrOverload) {
		t.Fatalf("Do returned %v, want fn's error", err)
	}
	if e := one("Do overloaded"); !e.Overload {
		t.Errorf("Do of an fn that returned %q reported no overload", refused)
	}

	// A permit: reported, reported twice, not reported.
	p, err := s.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tokensem.ReportUse(p, time.Hour, false)
	tokensem.ReportUse(p, 7*time.Millisecond, true) // the later report counts
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if e := one("reported permit"); e.Use != 7*time.Millisecond || !e.Overload || !e.Reported {
		t.Errorf("a permit reported 7 ms, overloaded: the event says %v, overload %v, reported %v", e.Use, e.Overload, e.Reported)
	}
	tokensem.ReportUse(p, time.Minute, false) // after the release: nothing changes, nothing breaks
	if p, err = s.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if e := one("unreported permit"); e.Use != e.Held || e.Overload || e.Reported {
		t.Errorf("an unreported permit's event says use %v, held %v, overload %v, reported %v", e.Use, e.Held, e.Overload, e.Reported)
	}
	// The window counts the three reported holds, not the unreported one
	// (its Held would stand for a use it never reported).
	sample := w.Take()
	want := adaptive.Sample{Limit: 3, Holds: 3, Drops: 2}
	if sample.Limit != want.Limit || sample.Holds != want.Holds || sample.Drops != want.Drops {
		t.Errorf("window sample %+v, want %+v", sample, want)
	}
	if sample.Busy <= 0 || sample.Busy > 1 {
		t.Errorf("window's mean permits held %v, one at a time: want (0, 1]", sample.Busy)
	}
	if sample.RTT < (30+7)*time.Millisecond/3 {
		t.Errorf("window latency %v: less than the mean of the 30 ms, the overloaded and the 7 ms reports", sample.RTT)
	}

	// A weighted caller's set: each permit is a use; the window sees them
	// held at once.
	ws, ok := s.(tokensem.Weighted)
	if !ok {
		return
	}
	set, err := ws.AcquireN(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	set.ReportUse(5*time.Millisecond, true)
	if err := set.Release(ctx); err != nil {
		t.Fatal(err)
	}
	got := ev.take()
	if len(got) != 3 {
		t.Fatalf("a set of 3 ended with %d events", len(got))
	}
	for _, e := range got {
		if e.Use != 5*time.Millisecond || !e.Overload {
			t.Errorf("a set's permit reported 5 ms, overloaded: the event says %v, overload %v", e.Use, e.Overload)
		}
	}
	if sample := w.Take(); sample.Busy <= 0 || sample.Busy > 3 || sample.Holds != 3 || sample.Drops != 3 || sample.RTT != 5*time.Millisecond {
		t.Errorf("window sample after a set of 3: %+v, want (0, 3] held on average, 3 holds, 3 drops, 5 ms", sample)
	}
}

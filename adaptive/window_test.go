package adaptive_test

import (
	"testing"
	"time"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/adaptive"
)

// TestWindowBusy: a window's Busy is the permits held on average over it,
// counting holds still under way; bounds come from the clock read around
// each step, so the test holds on a slow machine.
func TestWindowBusy(t *testing.T) {
	const name = "w"
	w := adaptive.NewWindow(name)
	ev := func(k tokensem.EventKind) tokensem.Event {
		return tokensem.Event{Semaphore: name, Kind: k, Outcome: tokensem.OutcomeAcquired, Permits: 4, Use: 10 * time.Millisecond}
	}
	t0 := time.Now()
	w.Take() // the window starts in [t0, t1]
	w.Observe(ev(tokensem.EventAcquire))
	w.Observe(ev(tokensem.EventAcquire))
	w.Observe(tokensem.Event{Semaphore: "another", Kind: tokensem.EventAcquire, Outcome: tokensem.OutcomeAcquired})
	t1 := time.Now()
	time.Sleep(50 * time.Millisecond)
	t2 := time.Now()
	s := w.Take() // ends in [t2, t3]
	t3 := time.Now()
	if low := 2 * t2.Sub(t1).Seconds() / t3.Sub(t0).Seconds(); s.Busy < low || s.Busy > 2 || s.Holds != 0 || s.Limit != 4 {
		t.Fatalf("two permits held through the window: %+v, want Busy in [%.3f, 2], no hold ended, limit 4", s, low)
	}

	// One ends at once, the other is held on: Busy is 1 and a bit.
	w.Observe(ev(tokensem.EventRelease))
	t5 := time.Now()
	time.Sleep(50 * time.Millisecond)
	t6 := time.Now()
	s = w.Take()
	high := 1 + t5.Sub(t2).Seconds()/t6.Sub(t3).Seconds()
	if s.Busy < 1 || s.Busy > high || s.Holds != 1 || s.RTT != 10*time.Millisecond {
		t.Fatalf("one permit held through the window, one ended at its start: %+v, want Busy in [1, %.3f], one hold of 10 ms", s, high)
	}

	// Nothing held: nothing busy.
	w.Observe(ev(tokensem.EventRelease))
	w.Take()
	if s := w.Take(); s.Busy != 0 {
		t.Fatalf("no permit held: Busy %v", s.Busy)
	}
}

// TestWindowReportedHolds: when some holds of a window reported their use,
// its Holds and RTT are theirs: a permit let go unused (Use = Held, a
// moment) does not pull the latency down; when none reported, every hold
// counts by its Held.
func TestWindowReportedHolds(t *testing.T) {
	const name = "w"
	w := adaptive.NewWindow(name)
	end := func(use time.Duration, reported, overload bool) {
		w.Observe(tokensem.Event{Semaphore: name, Kind: tokensem.EventAcquire, Outcome: tokensem.OutcomeAcquired, Permits: 4})
		w.Observe(tokensem.Event{Semaphore: name, Kind: tokensem.EventRelease, Permits: 4, Use: use, Reported: reported, Overload: overload})
	}
	end(50*time.Millisecond, true, false)
	end(30*time.Millisecond, true, true)
	for range 8 {
		end(time.Millisecond, false, false) // an AcquireN's permits let go
	}
	if s := w.Take(); s.Holds != 2 || s.RTT != 40*time.Millisecond || s.Drops != 1 {
		t.Fatalf("two reported holds of 50 and 30 ms beside 8 unreported of 1 ms: %+v; want 2 holds, RTT 40 ms, 1 drop", s)
	}
	end(time.Millisecond, false, false)
	end(3*time.Millisecond, false, false)
	if s := w.Take(); s.Holds != 2 || s.RTT != 2*time.Millisecond {
		t.Fatalf("two unreported holds of 1 and 3 ms: %+v; want 2 holds, RTT 2 ms", s)
	}
}

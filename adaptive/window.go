package adaptive

import (
	"sync"
	"time"

	"github.com/tokensem/tokensem"
)

// Window sums what the holders of one semaphore in this process report
// (see tokensem.ReportUse; Do reports by itself) into the Sample of the
// current window: give it to the semaphore as an Observer (each backend's
// WithObserver), and Take the sample at the end of each window. It costs
// a mutex per event and nothing at the broker. Safe for concurrent use.
type Window struct {
	name string

	mu       sync.Mutex
	limit    int
	inFlight int       // permits held now, as this process saw them taken and end (briefly -1: see Observe)
	start    time.Time // of the window
	last     time.Time // of the last change of inFlight
	area     float64   // permits held × seconds, since start until last
	holds    int
	drops    int
	use      time.Duration // summed over the window's holds
	reported int           // the holds whose holder reported its use (Event.Reported)
	repUse   time.Duration // summed over those
}

// NewWindow returns a Window of semaphore name's events; it ignores other
// semaphores'.
func NewWindow(name string) *Window {
	now := time.Now()
	return &Window{name: name, start: now, last: now}
}

// advance adds the permits held since the last change to the window's
// area, up to now.
func (w *Window) advance(now time.Time) {
	if w.inFlight > 0 {
		w.area += float64(w.inFlight) * now.Sub(w.last).Seconds()
	}
	w.last = now
}

// Observe implements tokensem.Observer.
func (w *Window) Observe(e tokensem.Event) {
	if e.Semaphore != w.name {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.advance(time.Now()) // under the lock: the clock never runs back in the area
	if e.Permits > 0 {
		w.limit = e.Permits
	}
	switch e.Kind {
	case tokensem.EventAcquire:
		if e.Outcome == tokensem.OutcomeAcquired {
			w.inFlight++
		}
	case tokensem.EventRelease, tokensem.EventLost:
		// Not clamped at 0: a permit lost before its Acquire returned
		// (natssem, when the claim outlasted the lease) ends before it
		// is observed taken, and the two must still cancel out.
		w.inFlight--
		w.holds++
		w.use += e.Use
		if e.Reported {
			w.reported++
			w.repUse += e.Use
		}
		if e.Overload {
			w.drops++
		}
	}
}

// Take returns the sample of the window that ends now and starts the next:
// its holds are those that ended since the last Take (or NewWindow), its
// Busy the permits this process held on average meanwhile. When some of
// the holds reported their use (ReportUse, Do), Holds and RTT are theirs
// alone: a permit let go unused (a failed AcquireN's) would pull the
// latency down; when none did, they are every hold's, by its Held.
func (w *Window) Take() Sample {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	w.advance(now)
	s := Sample{Limit: w.limit, Holds: w.holds, Drops: w.drops}
	if d := now.Sub(w.start).Seconds(); d > 0 {
		s.Busy = w.area / d
	}
	use := w.use
	if w.reported > 0 {
		s.Holds, use = w.reported, w.repUse
	}
	if s.Holds > 0 {
		s.RTT = use / time.Duration(s.Holds)
	}
	w.start, w.area, w.holds, w.drops, w.use, w.reported, w.repUse = now, 0, 0, 0, 0, 0, 0
	return s
}

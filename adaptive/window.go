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
	inFlight int // permits held now, as this process saw them taken and end (briefly -1: see Observe)
	peak     int // the most held at once in this window
	holds    int
	drops    int
	use      time.Duration // summed over the window's holds
}

// NewWindow returns a Window of semaphore name's events; it ignores other
// semaphores'.
func NewWindow(name string) *Window { return &Window{name: name} }

// Observe implements tokensem.Observer.
func (w *Window) Observe(e tokensem.Event) {
	if e.Semaphore != w.name {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if e.Permits > 0 {
		w.limit = e.Permits
	}
	switch e.Kind {
	case tokensem.EventAcquire:
		if e.Outcome == tokensem.OutcomeAcquired {
			w.inFlight++
			w.peak = max(w.peak, w.inFlight)
		}
	case tokensem.EventRelease, tokensem.EventLost:
		// Not clamped at 0: a permit lost before its Acquire returned
		// (natssem, when the claim outlasted the lease) ends before it
		// is observed taken, and the two must still cancel out.
		w.inFlight--
		w.holds++
		w.use += e.Use
		if e.Overload {
			w.drops++
		}
	}
}

// Take returns the sample of the window that ends now and starts the next:
// its holds are those that ended since the last Take, its InFlight the
// most permits this process held at once meanwhile.
func (w *Window) Take() Sample {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := Sample{Limit: w.limit, InFlight: w.peak, Holds: w.holds, Drops: w.drops}
	if w.holds > 0 {
		s.RTT = w.use / time.Duration(w.holds)
	}
	w.peak, w.holds, w.drops, w.use = max(0, w.inFlight), 0, 0, 0
	return s
}

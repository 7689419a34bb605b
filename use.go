package tokensem

import (
	"errors"
	"time"
)

// ErrOverload says that the protected resource was overloaded: it refused
// the work, shed it or timed out. A Do whose fn returns an error wrapping
// it reports the use as overloaded (see ReportUse); tokensem itself never
// returns it.
var ErrOverload = errors.New("tokensem: the protected resource is overloaded")

// useReporter is implemented by the permits that carry a report of their
// use to their semaphore's Observer: both backends' permits, and
// PermitSet, which reports to each of its permits.
type useReporter interface {
	// ReportUse records how the holder's use of the permit went (see
	// ReportUse).
	ReportUse(took time.Duration, overloaded bool)
}

// ReportUse records how the holder's use of p went, for an adaptive limit
// (package adaptive): how long the use of the protected resource took
// (not the wait for the permit), and whether the resource was overloaded.
// Call it before Release; the report rides on p's EventRelease or
// EventLost to the semaphore's Observer (Event.Use, Event.Overload), in
// this process, without a broker round trip. A later report replaces an
// earlier one. Do reports for fn by itself. Both backends' permits and
// PermitSet carry the report; any other permit (a Block's) ignores it.
func ReportUse(p Permit, took time.Duration, overloaded bool) {
	if r, ok := p.(useReporter); ok {
		r.ReportUse(took, overloaded)
	}
}

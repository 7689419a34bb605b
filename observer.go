package tokensem

import "time"

// Observer receives what happens to a semaphore's permits in this process,
// for metrics (package semmetrics turns the events into Prometheus
// metrics). Backends call Observe synchronously from the goroutine where
// the event happened, so it must be fast, must not block and must be safe
// for concurrent use.
type Observer interface {
	Observe(Event)
}

// EventKind says what an Event reports.
type EventKind int

const (
	// EventAcquire: an Acquire or TryAcquire returned; Outcome says how and
	// Wait how long it took.
	EventAcquire EventKind = iota + 1
	// EventRelease: a held permit was released; Held is how long it was
	// held.
	EventRelease
	// EventLost: a held permit was lost (Err says why); Held is how long it
	// was held. It is observed just after the permit's Done closes: the
	// holder learns first.
	EventLost
	// EventRenew: a lease renewal ended, successfully when Err is nil. A
	// failed renewal is retried until the lease runs out (then EventLost).
	// Only leased backends (natssem) renew.
	EventRenew
)

// Outcome is how an Acquire or TryAcquire ended.
type Outcome string

const (
	OutcomeAcquired Outcome = "acquired"
	OutcomeTimeout  Outcome = "timeout"   // ctx ended first
	OutcomeNoPermit Outcome = "no_permit" // TryAcquire found none free
	OutcomeError    Outcome = "error"     // a broker error, ErrClosed, ...
)

// Event is one thing that happened to a semaphore's permits.
type Event struct {
	Kind      EventKind
	Semaphore string
	Permits   int           // the semaphore's N as this client knows it
	Outcome   Outcome       // EventAcquire
	Wait      time.Duration // EventAcquire: time spent in the call
	Held      time.Duration // EventRelease, EventLost
	Err       error         // EventAcquire (unless acquired), EventLost, EventRenew

	// Use is how long the holder's use of the permit took, as it reported
	// it (see ReportUse; Do reports fn's run), else Held; Overload says
	// that the holder reported the protected resource overloaded;
	// Reported, that the holder reported at all (a permit let go unused,
	// such as the part of an AcquireN that failed, did not).
	// EventRelease, EventLost.
	Use      time.Duration
	Overload bool
	Reported bool
}

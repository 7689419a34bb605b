package permitstate

import (
	"fmt"
	"sync"
	"time"

	"github.com/tokensem/tokensem"
)

type phase int

const (
	held phase = iota
	releasing
	released
	lost
)

// State is a permit's life cycle. The zero State is not usable; use New.
type State struct {
	mu    sync.Mutex
	phase phase
	err   error
	done  chan struct{}

	obs     tokensem.Observer // nil: none
	event   tokensem.Event    // Semaphore and Permits, for obs
	started time.Time

	use      time.Duration // reported by the holder (ReportUse)
	overload bool
	reported bool
}

// New returns the state of a freshly held permit of semaphore name (of
// permits permits), which reports its release or loss to obs (nil: none).
func New(obs tokensem.Observer, name string, permits int) *State {
	return &State{done: make(chan struct{}), obs: obs, started: time.Now(),
		event: tokensem.Event{Semaphore: name, Permits: permits}}
}

// observe reports the end of the permit; s.mu must not be held (Observe
// may take its time).
func (s *State) observe(kind tokensem.EventKind, err error) {
	if s.obs == nil {
		return
	}
	e := s.event
	e.Kind, e.Held, e.Err = kind, time.Since(s.started), err
	s.mu.Lock()
	e.Use, e.Overload, e.Reported = s.use, s.overload, s.reported
	if !s.reported {
		e.Use = e.Held
	}
	s.mu.Unlock()
	s.obs.Observe(e)
}

// ReportUse records how the holder's use of the permit went, for the
// event that ends it (see tokensem.ReportUse). A report after the end
// changes nothing.
func (s *State) ReportUse(took time.Duration, overloaded bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.phase == held || s.phase == releasing {
		s.use, s.overload, s.reported = max(0, took), overloaded, true
	}
}

// Done is closed once the permit is released or lost.
func (s *State) Done() <-chan struct{} { return s.done }

// Err is nil while held, tokensem.ErrReleased after a release, and an error
// wrapping tokensem.ErrLeaseLost after a loss.
func (s *State) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// BeginRelease starts a release. It fails with tokensem.ErrReleased when a
// release already started, and with the loss when the permit was lost.
func (s *State) BeginRelease() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch s.phase {
	case releasing, released:
		return tokensem.ErrReleased
	case lost:
		return s.err
	}
	s.phase = releasing
	return nil
}

// Lose records a loss of what (the token) for cause, unless the permit was
// released already. It reports whether this call recorded the loss.
func (s *State) Lose(what fmt.Stringer, cause error) bool {
	s.mu.Lock()
	if s.phase != held && s.phase != releasing {
		s.mu.Unlock()
		return false
	}
	s.phase = lost
	s.err = fmt.Errorf("%w: %s: %w", tokensem.ErrLeaseLost, what, cause)
	err := s.err
	close(s.done)
	s.mu.Unlock()
	s.observe(tokensem.EventLost, err)
	return true
}

// Released completes a release begun by BeginRelease. It returns the loss
// instead if the permit was lost meanwhile.
func (s *State) Released() error {
	s.mu.Lock()
	if s.phase == lost {
		s.mu.Unlock()
		return s.err
	}
	s.phase, s.err = released, tokensem.ErrReleased
	close(s.done)
	s.mu.Unlock()
	s.observe(tokensem.EventRelease, nil)
	return nil
}

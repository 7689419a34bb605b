// Package adaptive computes a semaphore's next permit count from how its
// holders' use of the permits went: the limit algorithms of TCP congestion
// control, as Netflix's concurrency-limits applies them to one process's
// concurrency (github.com/Netflix/concurrency-limits: AIMDLimit,
// Gradient2Limit, VegasLimit), applied here to a whole fleet's.
//
// The algorithms run on windows: the holders' reports of one window (a
// second, say) are summed into a Sample, and an Algorithm turns it into the
// limit for the next window. They know nothing of brokers; a controller
// applies their answer with Resize, bounded by a range and a rate.
package adaptive

import (
	"fmt"
	"math"
	"time"
)

// Sample is what a semaphore's holders reported over one window.
type Sample struct {
	// Limit is the semaphore's permit count during the window.
	Limit int
	// Busy is how many permits were held on average over the window (the
	// time integral of the permits held, divided by the window's length).
	// Means add up across processes, where the peaks of one window need
	// not coincide: a fleet's Busy is the sum of its processes'.
	Busy float64
	// RTT is the window's latency: the mean time the holds that ended in
	// it took (the use of the permit, not the wait for it).
	RTT time.Duration
	// Holds is how many holds ended in the window; Drops how many of them
	// reported that the downstream was overloaded (a timeout, a 503, a
	// refused connection).
	Holds, Drops int
}

// Algorithm turns one window's sample into the next window's limit. An
// Algorithm keeps state across windows (a baseline latency); it is not
// safe for concurrent use.
type Algorithm interface {
	// Next returns the limit for the next window, at least 1. A window
	// in which no hold ended leaves the limit as it is.
	Next(s Sample) int
}

// AIMD is additive increase, multiplicative decrease (AIMDLimit in
// concurrency-limits; TCP Reno's congestion window): a window with a drop,
// or with a latency above Timeout, multiplies the limit by Backoff (taking
// at least one off); a window in which at least half the permits were in
// use on average (Sample.Busy) adds Increase; otherwise the limit stays
// (the fleet did not need more). It finds the concurrency at which the downstream starts to refuse
// or to time out, and oscillates just below it.
//
// A fleet's window holds many holds: DropRatio is the share of them that
// must report an overload for the window to count as dropping (default 0:
// any one, as in concurrency-limits, where a window is one request). A
// fleet whose downstream sheds a little load all the time sets it above
// that background.
type AIMD struct {
	Increase  int           // default 1
	Backoff   float64       // in (0, 1); default 0.9
	Timeout   time.Duration // latency counted as a drop; 0: drops only
	DropRatio float64       // in [0, 1); see above
}

// Next implements Algorithm.
func (a *AIMD) Next(s Sample) int {
	limit := max(s.Limit, 1)
	if s.Holds == 0 {
		return limit
	}
	backoff := a.Backoff
	if backoff <= 0 || backoff >= 1 {
		backoff = 0.9
	}
	switch {
	case s.Drops > 0 && float64(s.Drops) > a.DropRatio*float64(s.Holds) || a.Timeout > 0 && s.RTT > a.Timeout:
		return max(1, min(limit-1, int(float64(limit)*backoff)))
	case s.Busy*2 >= float64(limit):
		return limit + max(a.Increase, 1)
	}
	return limit
}

// Gradient follows the latency rather than drops, after Gradient2Limit
// and VegasLimit in concurrency-limits. The gradient is baseline / latency
// (clamped to [0.5, 1]), and the holds queued at the downstream are
// estimated as limit × (1 - gradient) (Little's law, as Vegas does):
//   - more than Queue queued (or a drop reported): the limit goes to
//     limit × gradient + Queue, the concurrency the downstream serves
//     without queueing plus Queue (Gradient2's rule), smoothed: it moves a
//     share Smoothing of the way;
//   - less than Queue/2 queued: the limit grows by one below the limit
//     at which the downstream last queued, and beyond it by a step that
//     doubles with each such window in a row, up to a share Growth of the
//     limit (TCP's congestion avoidance and slow start, the other way
//     round: the known ceiling is approached one at a time, the unknown
//     beyond it probed fast), so a capacity that doubled is found in a few
//     windows;
//   - in between, it stays.
//
// Unlike Gradient2, whose windows are requests and whose baseline is a
// ten-minute average, a fleet's windows are a second apart: the baseline
// is the lowest window latency of the last BaselineWindows windows (Vegas's
// no-load latency), so a downstream that gets slower for good is the new
// baseline once that many windows have passed. A window that used less than
// half the limit on average (Sample.Busy) changes nothing.
type Gradient struct {
	Queue           float64 // holds allowed to queue at the downstream; default 1
	Growth          float64 // largest growth step, a share of the limit; default 0.25
	Smoothing       float64 // in (0, 1]; default 0.5
	BaselineWindows int     // windows the baseline looks back; default 300

	estimate float64
	step     float64
	ceiling  float64         // the limit at which the downstream last queued
	recent   []time.Duration // latency of the last windows, oldest first
}

// Next implements Algorithm.
func (g *Gradient) Next(s Sample) int {
	limit := max(s.Limit, 1)
	if g.estimate == 0 || int(g.estimate) != limit {
		g.estimate = float64(limit) // started, or resized by someone else
	}
	g.step = max(g.step, 1)
	if s.Holds == 0 || s.RTT <= 0 {
		return limit
	}
	keep := cmpOr(g.BaselineWindows, 300)
	g.recent = append(g.recent, s.RTT)
	if len(g.recent) > keep {
		g.recent = g.recent[len(g.recent)-keep:]
	}
	baseline := s.RTT
	for _, d := range g.recent {
		baseline = min(baseline, d)
	}
	if s.Busy < g.estimate/2 {
		return limit
	}
	gradient := math.Max(0.5, math.Min(1, float64(baseline)/float64(s.RTT)))
	if s.Drops > 0 {
		gradient = 0.5
	}
	allowed := g.Queue
	if allowed <= 0 {
		allowed = 1
	}
	switch queued := g.estimate * (1 - gradient); {
	case queued > allowed || s.Drops > 0:
		g.ceiling = g.estimate
		next := g.estimate*gradient + allowed
		smoothing := cmpOrF(g.Smoothing, 0.5)
		g.estimate = math.Max(1, g.estimate*(1-smoothing)+next*smoothing)
		g.step = 1
	case queued < allowed/2:
		if g.estimate < g.ceiling {
			g.estimate++
			g.step = 1
			break
		}
		g.estimate += g.step
		g.step = math.Max(1, math.Min(2*g.step, g.estimate*cmpOrF(g.Growth, 0.25)))
	default:
		g.step = 1
	}
	return int(g.estimate)
}

// cmpOr returns v, or def if v is not positive.
func cmpOr(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

// cmpOrF returns v, or def if v is not in (0, 1].
func cmpOrF(v, def float64) float64 {
	if v > 0 && v <= 1 {
		return v
	}
	return def
}

// Bounds keep a controller's limits in [Min, Max] and change them by at
// most MaxStep a window (0: no bound on the step).
type Bounds struct {
	Min, Max, MaxStep int
}

// Validate reports whether b is usable.
func (b Bounds) Validate() error {
	if b.Min < 1 || b.Max < b.Min || b.MaxStep < 0 {
		return fmt.Errorf("adaptive: bounds [%d, %d] step %d: want 1 <= min <= max and a step >= 0", b.Min, b.Max, b.MaxStep)
	}
	return nil
}

// Apply returns next moved into b from cur.
func (b Bounds) Apply(cur, next int) int {
	if b.MaxStep > 0 {
		next = min(max(next, cur-b.MaxStep), cur+b.MaxStep)
	}
	return min(max(next, b.Min), b.Max)
}

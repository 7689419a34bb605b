package chaos

import (
	"fmt"
	"math"
	"time"
)

// A Life is one life of the semaphore: from the Init that made it to the
// Delete (or ForceDelete) that removed it, in the harness's stamps around
// its calls. Nothing of the life exists before Created or after Gone.
type Life struct {
	// Init's call and return: the life began in between.
	Created, Ready int64
	// Deleting is the first call of the delete that ended the life (a
	// refused Delete included), Gone the return of the call that
	// succeeded; both 0 for the life the run ended in.
	Deleting, Gone int64
	// Permits is the count Init made the life with.
	Permits int
	// Lease is the NATS lease Init gave it (0 on RabbitMQ), for the log.
	Lease time.Duration
	// Resizes are the life's resizes, in order.
	Resizes []Resize
}

// Resize is one resize of a life, from the first call to the return of
// the call that succeeded.
type Resize struct {
	Begin, End int64
	From, To   int
}

// gone is the instant by which nothing of the life existed any more.
func (l Life) gone() int64 {
	if l.Gone == 0 {
		return math.MaxInt64
	}
	return l.Gone
}

// permits is the count the life ended with.
func (l Life) permits() int {
	if n := len(l.Resizes); n > 0 {
		return l.Resizes[n-1].To
	}
	return l.Permits
}

// Timeline is what the harness did to the semaphore: its lives, in order,
// and their resizes. Holds are tied to it by time alone (a permit does not
// say which life it belongs to, and must not need to).
type Timeline struct {
	Lives []Life
	// Converge is how long after a resize returned a client may still
	// admit by the count before it (both backends promise 2 s).
	Converge time.Duration
}

// Fixed is the timeline of a semaphore of permits slots that lives for
// ever: the fixed-N scenarios.
func Fixed(permits int) Timeline {
	return Timeline{Lives: []Life{{Created: math.MinInt64, Ready: math.MinInt64, Permits: permits}}}
}

// span is a stretch of time [from, to) during which admission may go up to
// n: the count in force, or max(old, new) while clients learn a new one.
type span struct {
	from, to int64
	n        int
}

// spans returns the admission bound over time. Within a life: its count,
// and each resize's max(old, new) from the resize's call until Converge
// after it returned (Resize's contract). Across a Delete and the next
// Init: the larger of the two lives' counts, from the delete's first call
// until the new life is ready (the seam rule of Check, not this bound, is
// what forbids the two lives' holders to overlap).
func (tl Timeline) spans() []span {
	var out []span
	for i, l := range tl.Lives {
		cur, start := l.Permits, l.Created
		for _, r := range l.Resizes {
			out = append(out, span{start, r.Begin, cur},
				span{r.Begin, r.End + int64(tl.Converge), max(r.From, r.To)})
			cur, start = r.To, r.Begin
		}
		out = append(out, span{start, l.gone(), cur})
		if i+1 < len(tl.Lives) {
			from := l.Deleting
			if from == 0 {
				from = l.Gone
			}
			out = append(out, span{from, tl.Lives[i+1].Ready, max(cur, tl.Lives[i+1].Permits)})
		}
	}
	return out
}

// boundAt is the admission bound at instant t.
func boundAt(spans []span, t int64) int {
	n := 0
	for _, s := range spans {
		if s.from <= t && t < s.to {
			n = max(n, s.n)
		}
	}
	return n
}

// boundOver is the largest admission bound at any instant of [a, b]: the
// most a take made somewhere in that interval may have been admitted by.
func boundOver(spans []span, a, b int64) int {
	n := 0
	for _, s := range spans {
		if s.from <= b && a < s.to {
			n = max(n, s.n)
		}
	}
	return n
}

// lives is the range of lives a hold's take may belong to: those that
// existed at some instant of [Call, Acquired] (a take happens between the
// two, in the life that exists then). lo > hi: none existed.
type lives struct{ lo, hi int }

func (tl Timeline) livesOf(h Hold) lives {
	r := lives{lo: len(tl.Lives), hi: -1}
	for i, l := range tl.Lives {
		if l.Created <= h.Acquired && h.Call <= l.gone() {
			r.lo, r.hi = min(r.lo, i), max(r.hi, i)
		}
	}
	return r
}

// known reports whether the take certainly belongs to one life.
func (r lives) known() bool { return r.lo == r.hi }

// before reports whether every life r may belong to came before every life
// o may belong to.
func (r lives) before(o lives) bool { return r.lo <= r.hi && o.lo <= o.hi && r.hi < o.lo }

// label names the lives for people (counted from 1), or nothing for a
// timeline of one life.
func (tl Timeline) label(r lives) string {
	switch {
	case len(tl.Lives) <= 1:
		return ""
	case r.lo > r.hi:
		return ", no life"
	case r.known():
		return fmt.Sprintf(", life %d", r.lo+1)
	}
	return fmt.Sprintf(", life %d..%d", r.lo+1, r.hi+1)
}

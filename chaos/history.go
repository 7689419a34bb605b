package chaos

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

// Hold is one permit as its holder lived it, in Unix nanoseconds of the
// machine's clock (every process of a run is on one machine).
type Hold struct {
	Worker int
	Slot   int
	Fence  uint64
	// Acquire's call and return.
	Call, Acquired int64
	// End is when the holder stopped holding: the call of its Release, or
	// the moment it saw the permit lost. Ended false: it never said (it
	// was killed while holding or releasing).
	End   int64
	Ended bool
	// Releasing is the call of its Release when the holder said it was
	// about to release (before the call), or 0. A holder killed inside
	// Release, or between Release and its report, has Releasing but not
	// Ended: its release may have freed the slot from then on.
	Releasing int64
	// Lost: the permit ended by a loss, seen at End.
	Lost bool
	// Fault is the earliest instant at which a fault the harness injected
	// (a kill, a freeze, a cut or delayed link, a broker restart) may have
	// freed the slot behind this holder's back, or 0: see charge.
	Fault int64
}

// freeAfter is the earliest instant at which the slot may have been freed:
// the holder's own end for a clean release, the fault that hit it for a
// loss or a kill. A loss with no fault (a holder whose renewals failed
// while it ran) must have been seen before anyone else took the slot: the
// backends promise that Done closes first.
func (h Hold) freeAfter() int64 {
	switch {
	case !h.Ended && h.Releasing != 0:
		if h.Fault != 0 {
			return min(h.Fault, h.Releasing)
		}
		return h.Releasing
	case h.Fault != 0 && (h.Lost || !h.Ended):
		return h.Fault
	}
	return h.End
}

// freeBy is the latest instant at which the slot was free again: the end a
// holder saw, or never for a holder that died before it could say.
func (h Hold) freeBy() int64 {
	if !h.Ended {
		return math.MaxInt64
	}
	return h.End
}

// liveEnd is when the holder stopped being able to act as a holder: its
// end, or its death for a killed one (Fault, but not before it said it
// held: it was alive then), or never.
func (h Hold) liveEnd() int64 {
	switch {
	case h.Ended:
		return h.End
	case h.Releasing != 0:
		return h.Releasing // it stopped holding when it called Release
	case h.Fault != 0:
		return max(h.Fault, h.Acquired)
	}
	return math.MaxInt64
}

// fault is one fault the harness injected into one worker, or into all of
// them (worker -1: a broker restart, a node loss). Its instants come from
// the harness's clock, the holds' from the workers': one machine, one
// clock.
type fault struct {
	worker int
	kind   string // "kill", "freeze", "cut", "delay", "restart", "node-loss"
	// begin is stamped just before the fault is applied (the signal sent,
	// the link cut or paused, the server shut down); end once it is over
	// (the killed worker reaped, Cut returned, SIGCONT sent, the link
	// resumed, the server back). The fault took effect somewhere between.
	begin, end int64
	// stopped, for a freeze, is stamped once every thread of the worker
	// was seen stopped (0: never seen; the freeze is then treated like a
	// link fault, over [begin, end]).
	stopped int64
}

// charge sets each hold's Fault: the earliest begin of a fault that may
// have freed its slot while it held, never before the hold's Call (a slot
// is not freed from under a holding that has not begun). Which holds a
// fault may hit depends on where it strikes:
//
//   - A kill hits only the hold its worker never ended: a worker that said
//     a hold ended was alive after that, so the kill came later; and the
//     worker was alive when it stamped Acquired, so that hold's slot was
//     not freed by the kill before then.
//   - A freeze hits the holds live at the instant the worker stopped,
//     among them one whose Acquire was called before the stop and
//     returned after SIGCONT. A worker stamps nothing while it is stopped,
//     so each of its stamps is either before the stop (so at most stopped)
//     or after SIGCONT: a hold that began after stopped began after the
//     freeze, and one that ended before stopped ended before it.
//   - A cut, a delay, a restart or a node loss strikes the link or the
//     broker, which may free the slot before the holder can see it: it
//     hits every hold of its worker (all, for -1) that overlaps [begin,
//     end], including one that begins while the link is held or the
//     broker is down.
//
// A hold no fault hits keeps Fault 0: a loss it reports must then have
// been seen before anyone else took its slot.
func charge(holds []Hold, faults []fault) {
	for i := range holds {
		h := &holds[i]
		for _, f := range faults {
			if at, ok := f.hits(*h); ok && (h.Fault == 0 || at < h.Fault) {
				h.Fault = at
			}
		}
	}
}

// hits reports whether f may have freed h's slot, and from when.
func (f fault) hits(h Hold) (int64, bool) {
	if f.worker != -1 && f.worker != h.Worker {
		return 0, false
	}
	end := h.freeBy() // the hold's end, or never
	switch {
	case f.kind == "kill":
		if h.Ended || h.Call > f.end {
			return 0, false
		}
		return max(f.begin, h.Acquired), true
	case f.kind == "freeze" && f.stopped != 0:
		if h.Call > f.stopped || end < f.stopped {
			return 0, false
		}
	default:
		if h.Call > f.end || end < f.begin {
			return 0, false
		}
	}
	return max(f.begin, h.Call), true
}

// slotOp is an operation of the per-slot model: take the slot with a fence,
// or free the holding of a fence.
type slotOp struct {
	Take  bool
	Fence uint64
}

// slotState is one slot: who holds it (fence 0: free) and the highest fence
// ever given.
type slotState struct {
	Held, Last uint64
}

// Model is the sequential specification of one slot of a fenced
// semaphore: a slot is taken only while free and only with a fence higher
// than any before it, and freed only by the holding it was given to. Each
// slot is a partition, so N slots admit at most N holders at any instant of
// a linearization.
var Model = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		bySlot := map[int][]porcupine.Operation{}
		for _, op := range history {
			s := op.Metadata.(int)
			bySlot[s] = append(bySlot[s], op)
		}
		keys := make([]int, 0, len(bySlot))
		for k := range bySlot {
			keys = append(keys, k)
		}
		sort.Ints(keys)
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, bySlot[k])
		}
		return out
	},
	Init: func() any { return slotState{} },
	Step: func(state, input, _ any) (bool, any) {
		s, op := state.(slotState), input.(slotOp)
		if op.Take {
			if s.Held != 0 || op.Fence <= s.Last {
				return false, s
			}
			return true, slotState{Held: op.Fence, Last: op.Fence}
		}
		if s.Held != op.Fence {
			return false, s
		}
		return true, slotState{Last: s.Last}
	},
	DescribeOperation: func(input, _ any) string {
		op := input.(slotOp)
		if op.Take {
			return fmt.Sprintf("take fence %d", op.Fence)
		}
		return fmt.Sprintf("free fence %d", op.Fence)
	},
}

// Operations turns holds into the model's history: a take over the
// Acquire's interval, and a free from freeAfter to freeBy.
func Operations(holds []Hold) []porcupine.Operation {
	ops := make([]porcupine.Operation, 0, 2*len(holds))
	for _, h := range holds {
		ops = append(ops,
			porcupine.Operation{ClientId: h.Worker, Input: slotOp{Take: true, Fence: h.Fence},
				Call: h.Call, Return: h.Acquired, Metadata: h.Slot},
			porcupine.Operation{ClientId: h.Worker, Input: slotOp{Fence: h.Fence},
				Call: min(h.freeAfter(), h.freeBy()), Return: h.freeBy(), Metadata: h.Slot})
	}
	return ops
}

// Verdict is what Check found.
type Verdict struct {
	Linearizable porcupine.CheckResult
	// Violations lists what broke the safety rules outright (also seen by
	// porcupine, named here for people).
	Violations []string
	// MaxHolders is the most holders at once by their own account (a
	// frozen or cut-off holder counts until it saw its loss);
	// MaxValidHolders counts only those whose fence was still the newest
	// of their slot (what a fenced resource would accept).
	MaxHolders, MaxValidHolders int
	// StaleOverlaps counts holds that a newer holder of the same slot
	// overlapped before the old holder saw its loss: the frozen-holder
	// window the fence is there for.
	StaleOverlaps int
	// Involved are the holds a named violation is about, for whoever reads
	// a failure.
	Involved []Hold
}

// Check checks holds of a semaphore of permits slots.
func Check(holds []Hold, permits int, timeout time.Duration) Verdict {
	var v Verdict
	v.Linearizable = porcupine.CheckOperationsTimeout(Model, Operations(holds), timeout)

	for _, h := range holds {
		if h.Slot < 0 || h.Slot >= permits {
			v.Violations = append(v.Violations, fmt.Sprintf("worker %d held slot %d of %d", h.Worker, h.Slot, permits))
		}
	}
	for slot, hs := range bySlot(holds) {
		// In fence order: the broker's order of the takes, if fences work.
		slices.SortFunc(hs, func(a, b Hold) int { return cmp.Compare(a.Fence, b.Fence) })
		latest := 0 // among lower fences, the hold whose Acquire began last
		for i := 1; i < len(hs); i++ {
			prev, cur := hs[i-1], hs[i]
			if cur.Fence == prev.Fence {
				v.Violations = append(v.Violations, fmt.Sprintf("slot %d: fence %d given twice (workers %d and %d)",
					slot, cur.Fence, prev.Worker, cur.Worker))
			}
			// A take that ended before another began must have the lower
			// fence. (Timestamps are taken around the calls, so a holder
			// paused right after Acquire returned reports a late Acquired:
			// only non-overlapping calls are ordered.)
			if hs[i-1].Call > hs[latest].Call {
				latest = i - 1
			}
			if l := hs[latest]; cur.Acquired < l.Call {
				v.Violations = append(v.Violations, fmt.Sprintf("slot %d: fence %d (worker %d) after fence %d (worker %d)",
					slot, l.Fence, l.Worker, cur.Fence, cur.Worker))
			}
			if cur.Acquired < prev.liveEnd() {
				if cur.Acquired < prev.freeAfter() {
					v.Violations = append(v.Violations, fmt.Sprintf("slot %d: worker %d acquired (fence %d) while worker %d held it (fence %d) with no fault to excuse it",
						slot, cur.Worker, cur.Fence, prev.Worker, prev.Fence))
					v.Involved = append(v.Involved, prev, cur)
				} else {
					v.StaleOverlaps++
				}
			}
		}
	}
	v.MaxHolders, v.MaxValidHolders = sweep(holds)
	return v
}

// sweep counts concurrent holders over time.
func sweep(holds []Hold) (all, valid int) {
	type edge struct {
		at    int64
		delta int
		h     int
	}
	var edges []edge
	for i, h := range holds {
		if h.liveEnd() <= h.Acquired {
			// Over the instant it began (a holder killed right after it
			// said it held): ends sort before starts, so its end would
			// come first and it would count for ever.
			continue
		}
		edges = append(edges, edge{h.Acquired, +1, i}, edge{h.liveEnd(), -1, i})
	}
	slices.SortFunc(edges, func(a, b edge) int {
		if c := cmp.Compare(a.at, b.at); c != 0 {
			return c
		}
		return a.delta - b.delta // ends before starts at one instant
	})
	newest := map[int]uint64{} // slot -> newest fence acquired so far
	live := map[int]bool{}
	for _, e := range edges {
		h := holds[e.h]
		if e.delta > 0 {
			live[e.h] = true
			newest[h.Slot] = max(newest[h.Slot], h.Fence)
		} else {
			delete(live, e.h)
		}
		n, nv := 0, 0
		for i := range live {
			n++
			if holds[i].Fence == newest[holds[i].Slot] {
				nv++
			}
		}
		all, valid = max(all, n), max(valid, nv)
	}
	return all, valid
}

// bySlot groups holds by slot.
func bySlot(holds []Hold) map[int][]Hold {
	out := map[int][]Hold{}
	for _, h := range holds {
		out[h.Slot] = append(out[h.Slot], h)
	}
	return out
}

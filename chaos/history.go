package chaos

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
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
	// Deadline is, on NATS, the permit's deadline when it was handed out
	// (0: unknown); for the log, not for the checker.
	Deadline int64 `json:",omitempty"`
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
	// porcupine, named here for people); Counts counts them by rule (see
	// Check), some of whose findings are named once per episode.
	Violations []string
	Rules      []string // the rule of each violation
	Counts     map[string]int
	// MaxHolders is the most holders at once by their own account (a
	// frozen or cut-off holder counts until it saw its loss);
	// MaxValidHolders counts only those whose fence was still the newest
	// of their slot (what a fenced resource would accept).
	MaxHolders, MaxValidHolders int
	// MaxRunning is the most holders at once that believed they held with
	// no fault to excuse them (see the capacity rule of Check).
	MaxRunning int
	// StaleOverlaps counts holds that a newer holder of the same slot
	// overlapped before the old holder saw its loss: the frozen-holder
	// window the fence is there for.
	StaleOverlaps int
	// Involved are the holds a named violation of holders (not of fences,
	// whose message says all) is about, for whoever reads a failure.
	Involved []Hold
}

func (v *Verdict) add(rule, msg string, involved ...Hold) {
	if v.Counts == nil {
		v.Counts = map[string]int{}
	}
	v.Counts[rule]++
	v.Violations = append(v.Violations, msg)
	v.Rules = append(v.Rules, rule)
	v.Involved = append(v.Involved, involved...)
}

// Check checks holds of a semaphore of permits slots that lives for ever.
func Check(holds []Hold, permits int, timeout time.Duration) Verdict {
	return CheckTimeline(holds, Fixed(permits), timeout)
}

// CheckTimeline checks holds against what the harness did to the
// semaphore (tl). porcupine checks the per-slot fenced lock (Model), which
// knows neither lives nor counts: a slot is its index, across lives,
// repairs and resizes. The rules named for people, each of which, when it
// fires, states something the timestamps prove (given the fences, where
// two takes overlap in time: see order):
//
//   - "no life": a take made while no life of the semaphore existed.
//   - "slot range": a slot at or above every count in force while the take
//     was made.
//   - "fence twice", "fence order": a slot's fences only grow, across lives
//     too: no fence is given twice, and a take that returned before another
//     was called has the lower fence.
//   - "takeover": a slot held again before its earlier holder was freed:
//     told of its loss, or struck by a fault that may free a slot behind
//     its holder's back (Hold.Fault). "takeover or fence": the same, if
//     the fences of two takes that overlapped in time tell their order;
//     if not, a fence went back.
//   - "seam": a slot of a life held before a holder of an earlier life
//     (any slot) was freed.
//   - "capacity": more holders at once, each believing it held and struck
//     by no such fault (so holding, by the backends' promise that a
//     running holder is told first), than the counts in force while they
//     were admitted allow (Timeline.spans: max(old, new) while clients
//     learn a resized count).
func CheckTimeline(holds []Hold, tl Timeline, timeout time.Duration) Verdict {
	var v Verdict
	v.Linearizable = porcupine.CheckOperationsTimeout(Model, Operations(holds), timeout)
	if len(holds) == 0 {
		return v
	}
	spans := tl.spans()
	ls := make([]lives, len(holds))
	adm := make([]int, len(holds))
	for i, h := range holds {
		ls[i], adm[i] = tl.livesOf(h), boundOver(spans, h.Call, h.Acquired)
		if ls[i].lo > ls[i].hi {
			v.add("no life", fmt.Sprintf("worker %d acquired slot %d (fence %d) while no life of the semaphore existed", h.Worker, h.Slot, h.Fence), h)
		}
		if h.Slot < 0 || h.Slot >= adm[i] {
			v.add("slot range", fmt.Sprintf("worker %d held slot %d of %d%s", h.Worker, h.Slot, adm[i], tl.label(ls[i])), h)
		}
	}
	checkFences(&v, holds, tl, ls)
	checkTakeovers(&v, holds, tl, ls)
	checkCapacity(&v, holds, tl, ls, adm)
	v.MaxHolders, v.MaxValidHolders = sweep(holds)
	return v
}

// checkFences names fences given twice or out of order, per slot.
func checkFences(v *Verdict, holds []Hold, tl Timeline, ls []lives) {
	slots := map[int][]int{}
	for i, h := range holds {
		slots[h.Slot] = append(slots[h.Slot], i)
	}
	for _, slot := range slices.Sorted(maps.Keys(slots)) {
		hs := slots[slot]
		// In fence order: the broker's order of the takes, if fences work.
		slices.SortStableFunc(hs, func(a, b int) int { return cmp.Compare(holds[a].Fence, holds[b].Fence) })
		latest := -1   // among lower fences, the hold whose Acquire began last
		reported := -1 // the latest already named, so that one regression is named once
		for k := 1; k < len(hs); k++ {
			prev, cur := holds[hs[k-1]], holds[hs[k]]
			if cur.Fence == prev.Fence {
				v.add("fence twice", fmt.Sprintf("slot %d: fence %d given twice (workers %d%s and %d%s)",
					slot, cur.Fence, prev.Worker, tl.label(ls[hs[k-1]]), cur.Worker, tl.label(ls[hs[k]])))
			}
			// A take that ended before another began must have the lower
			// fence. (Timestamps are taken around the calls, so a holder
			// paused right after Acquire returned reports a late Acquired:
			// only non-overlapping calls are ordered.)
			if latest < 0 || prev.Call > holds[latest].Call {
				latest = hs[k-1]
			}
			if l := holds[latest]; cur.Acquired < l.Call && reported != latest {
				reported = latest
				v.add("fence order", fmt.Sprintf("slot %d: fence %d (worker %d%s) after fence %d (worker %d%s)",
					slot, l.Fence, l.Worker, tl.label(ls[latest]), cur.Fence, cur.Worker, tl.label(ls[hs[k]])))
			}
		}
	}
}

// order reports whether p's take came before q's, and whether only their
// fences say so. Takes whose calls did not overlap are ordered by time, and
// takes of lives that certainly differ by life; overlapping takes by fence,
// which is their order unless the fences are wrong (checkTakeovers then
// looks at both orders).
func order(p, q Hold, lp, lq lives) (first, byFence bool) {
	switch {
	case p.Acquired < q.Call:
		return true, false
	case q.Acquired < p.Call:
		return false, false
	case lp.before(lq):
		return true, false
	case lq.before(lp):
		return false, false
	case p.Fence != q.Fence:
		return p.Fence < q.Fence, true
	}
	return p.Call < q.Call, true
}

// checkTakeovers names slots held again before their earlier holders were
// freed (takeover), and lives whose slots were held before a holder of an
// earlier life was freed (seam). Each stale holder is named once, with
// the first hold that overlapped it; StaleOverlaps counts the stale
// holders whose overlap a fault excuses.
//
// Sweep: a hold p is a candidate from its Call (its take came later) to
// its liveEnd (it no longer believed). At each hold q's Acquired, a
// candidate p whose take came before q's, of q's slot or of an earlier
// life, must have been freed by then (p.freeAfter).
func checkTakeovers(v *Verdict, holds []Hold, tl Timeline, ls []lives) {
	const (
		remove = iota
		add
		check
	)
	type event struct {
		at   int64
		kind int
		i    int
	}
	events := make([]event, 0, 3*len(holds))
	for i, h := range holds {
		if end := h.liveEnd(); end > h.Call {
			events = append(events, event{h.Call, add, i}, event{end, remove, i})
		}
		events = append(events, event{h.Acquired, check, i})
	}
	slices.SortFunc(events, func(a, b event) int {
		return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.kind, b.kind), cmp.Compare(a.i, b.i))
	})
	active := map[int]bool{}
	named := map[int]bool{} // stale holders already named
	stale := map[int]bool{}
	for _, e := range events {
		switch e.kind {
		case add:
			active[e.i] = true
			continue
		case remove:
			delete(active, e.i)
			continue
		}
		qi, q := e.i, holds[e.i]
		for _, pi := range slices.Sorted(maps.Keys(active)) {
			p := holds[pi]
			if pi == qi || named[pi] {
				continue
			}
			sameSlot, earlierLife := p.Slot == q.Slot, ls[pi].before(ls[qi])
			if !sameSlot && !earlierLife {
				continue
			}
			first, byFence := order(p, q, ls[pi], ls[qi])
			if !first {
				continue // q came first: looked at from p's Acquired
			}
			pq := q.Acquired < p.freeAfter() // p not freed when q held
			switch {
			case !sameSlot && pq:
				v.add("seam", fmt.Sprintf("worker %d acquired slot %d (fence %d%s) while worker %d still held slot %d (fence %d%s), untold of its life's end, with no fault to excuse it",
					q.Worker, q.Slot, q.Fence, tl.label(ls[qi]), p.Worker, p.Slot, p.Fence, tl.label(ls[pi])), p, q)
			case !sameSlot:
				continue
			case pq && !byFence:
				v.add("takeover", fmt.Sprintf("slot %d: worker %d acquired (fence %d%s) while worker %d held it (fence %d%s) with no fault to excuse it",
					q.Slot, q.Worker, q.Fence, tl.label(ls[qi]), p.Worker, p.Fence, tl.label(ls[pi])), p, q)
			case pq && p.Acquired < q.freeAfter():
				// Whichever took first was not freed when the other held.
				v.add("takeover", fmt.Sprintf("slot %d: workers %d (fence %d%s) and %d (fence %d%s) held it at once, the first to take it not freed when the other held it, with no fault to excuse it (their Acquire calls overlapped)",
					q.Slot, p.Worker, p.Fence, tl.label(ls[pi]), q.Worker, q.Fence, tl.label(ls[qi])), p, q)
			case pq && p.Fence == q.Fence:
				continue // no order at all: "fence twice" names the two
			case pq:
				// Only the fences' order makes it a takeover; the other order
				// makes the fence go back.
				v.add("takeover or fence", fmt.Sprintf("slot %d: either worker %d acquired (fence %d%s) while worker %d held it (fence %d%s) with no fault to excuse it, or fence %d came after fence %d (their Acquire calls overlapped)",
					q.Slot, q.Worker, q.Fence, tl.label(ls[qi]), p.Worker, p.Fence, tl.label(ls[pi]), p.Fence, q.Fence), p, q)
			default:
				if q.Acquired < p.liveEnd() {
					stale[pi] = true
				}
				continue
			}
			named[pi] = true
		}
	}
	v.StaleOverlaps = len(stale)
}

// checkCapacity names the episodes (one for each longest holder in one)
// in which more holders believed they held at once, none of them struck by a fault that excuses a takeover,
// than admission allowed: each such holder holds by the backends' promise
// that a running holder is told of a loss before anyone else may take its
// slot. A frozen or killed holder counts until the fault (the fence is the
// remedy for it). A holder was admitted by at most adm, the largest bound
// in force during its Acquire (Timeline.spans); for every k, the holders
// admitted by at most k must be at most k at any instant: each holds a
// slot below k. (So the rule follows from the slot range, takeover and
// seam rules; it states the promise of at most N holders in its own
// terms.)
func checkCapacity(v *Verdict, holds []Hold, tl Timeline, ls []lives, adm []int) {
	type event struct {
		at    int64
		delta int // -1 an end, +1 a start
		i     int
	}
	var events []event
	for i, h := range holds {
		if end := min(h.liveEnd(), h.freeAfter()); end > h.Acquired {
			events = append(events, event{h.Acquired, +1, i}, event{end, -1, i})
		}
	}
	slices.SortFunc(events, func(a, b event) int {
		return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.delta, b.delta))
	})
	base := slices.MinFunc(holds, func(a, b Hold) int { return cmp.Compare(a.Call, b.Call) }).Call
	active := map[int]bool{}
	over := false
	oldest := map[int]bool{} // the longest holder of each episode named
	for k, e := range events {
		if e.delta > 0 {
			active[e.i] = true
		} else {
			delete(active, e.i)
		}
		if k+1 < len(events) && events[k+1].at == e.at {
			continue // the instant is not over
		}
		v.MaxRunning = max(v.MaxRunning, len(active))
		held := slices.SortedFunc(maps.Keys(active), func(a, b int) int {
			return cmp.Or(cmp.Compare(adm[a], adm[b]), cmp.Compare(a, b))
		})
		n := 0 // the most holders admitted by at most adm[held[n-1]], beyond it
		for i, h := range held {
			if i+1 > adm[h] && (i+1 == len(held) || adm[held[i+1]] > adm[h]) {
				n = i + 1
			}
		}
		if n == 0 {
			over = false
			continue
		}
		if over {
			continue // one episode, named at its start
		}
		over = true
		first := slices.MinFunc(held, func(a, b int) int { return cmp.Compare(holds[a].Acquired, holds[b].Acquired) })
		if oldest[first] {
			continue // its longest holder's episode again, as others come and go
		}
		oldest[first] = true
		var who []string
		var involved []Hold
		for _, i := range held {
			h := holds[i]
			who = append(who, fmt.Sprintf("worker %d slot %d fence %d%s admitted by %d", h.Worker, h.Slot, h.Fence, tl.label(ls[i]), adm[i]))
			involved = append(involved, h)
		}
		v.add("capacity", fmt.Sprintf("at %+.3f s, %d holders held at once with no fault to excuse any, %d of them admitted while at most %d were allowed: %s",
			float64(e.at-base)/1e9, len(held), n, adm[held[n-1]], strings.Join(who, "; ")), involved...)
	}
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

package chaos

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// The checker must fail on unsafe histories: these are made by hand.
func TestCheck(t *testing.T) {
	tests := []struct {
		name       string
		holds      []Hold
		ok         bool
		violation  string
		max, valid int
		stale      int
	}{
		{"two slots, in turn", []Hold{
			{Worker: 0, Slot: 0, Fence: 1, Call: 0, Acquired: 10, End: 20, Ended: true},
			{Worker: 1, Slot: 1, Fence: 1, Call: 0, Acquired: 12, End: 30, Ended: true},
			{Worker: 2, Slot: 0, Fence: 2, Call: 5, Acquired: 25, End: 40, Ended: true},
		}, true, "", 2, 2, 0},
		{"a second holder of one slot", []Hold{
			{Worker: 0, Slot: 0, Fence: 1, Call: 0, Acquired: 10, End: 50, Ended: true},
			{Worker: 1, Slot: 0, Fence: 2, Call: 0, Acquired: 20, End: 30, Ended: true},
		}, false, "workers 0 (fence 1) and 1 (fence 2) held it at once", 2, 1, 0},
		{"a fence going back", []Hold{
			{Worker: 0, Slot: 0, Fence: 5, Call: 0, Acquired: 10, End: 20, Ended: true},
			{Worker: 1, Slot: 0, Fence: 3, Call: 15, Acquired: 30, End: 40, Ended: true},
		}, false, "fence 3 (worker 1) after fence 5", 1, 1, 0},
		{"more slots than permits", []Hold{
			{Worker: 0, Slot: 2, Fence: 1, Call: 0, Acquired: 10, End: 20, Ended: true},
		}, true, "held slot 2 of 2", 1, 1, 0},
		{"a loss seen after the takeover, with no fault", []Hold{
			{Worker: 0, Slot: 0, Fence: 1, Call: 0, Acquired: 10, End: 50, Ended: true, Lost: true},
			{Worker: 1, Slot: 0, Fence: 2, Call: 5, Acquired: 30, End: 60, Ended: true},
		}, false, "with no fault", 2, 1, 0},
		{"a frozen holder taken over", []Hold{
			{Worker: 0, Slot: 0, Fence: 1, Call: 0, Acquired: 10, End: 50, Ended: true, Lost: true, Fault: 15},
			{Worker: 1, Slot: 0, Fence: 2, Call: 5, Acquired: 30, End: 60, Ended: true},
		}, true, "", 2, 1, 1},
		{"a killed holder", []Hold{
			{Worker: 0, Slot: 0, Fence: 1, Call: 0, Acquired: 10, Fault: 15},
			{Worker: 1, Slot: 0, Fence: 2, Call: 5, Acquired: 30, End: 60, Ended: true},
		}, true, "", 1, 1, 0},
		{"a holder paused right after Acquire returned", []Hold{
			{Worker: 0, Slot: 0, Fence: 1, Call: 0, Acquired: 100, End: 110, Ended: true, Lost: true, Fault: 5},
			{Worker: 1, Slot: 0, Fence: 2, Call: 10, Acquired: 20, End: 30, Ended: true},
		}, true, "", 1, 1, 1},
		{"a fence given twice", []Hold{
			{Worker: 0, Slot: 0, Fence: 4, Call: 0, Acquired: 10, End: 20, Ended: true},
			{Worker: 1, Slot: 0, Fence: 4, Call: 25, Acquired: 30, End: 40, Ended: true},
		}, false, "fence 4 given twice", 1, 1, 0},
		{"a holder taken over before the fault", []Hold{
			{Worker: 0, Slot: 0, Fence: 1, Call: 0, Acquired: 10, End: 50, Ended: true, Lost: true, Fault: 40},
			{Worker: 1, Slot: 0, Fence: 2, Call: 5, Acquired: 30, End: 60, Ended: true},
		}, false, "workers 0 (fence 1) and 1 (fence 2) held it at once", 2, 1, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			checkVerdict(t, Check(tc.holds, 2, 10*time.Second), tc.ok, tc.violation, tc.max, tc.valid, tc.stale)
		})
	}
}

// checkVerdict compares what Check found with what a case wants.
func checkVerdict(t *testing.T, v Verdict, ok bool, violation string, maxHolders, valid, stale int) {
	t.Helper()
	if got := v.Linearizable == porcupine.Ok; got != ok {
		t.Errorf("linearizable = %v, want %v", v.Linearizable, ok)
	}
	found := violation == ""
	for _, s := range v.Violations {
		found = found || strings.Contains(s, violation)
	}
	if !found || (violation == "" && len(v.Violations) > 0) {
		t.Errorf("violations %q, want one containing %q", v.Violations, violation)
	}
	if v.MaxHolders != maxHolders || v.MaxValidHolders != valid || v.StaleOverlaps != stale {
		t.Errorf("max %d, valid %d, stale %d; want %d, %d, %d",
			v.MaxHolders, v.MaxValidHolders, v.StaleOverlaps, maxHolders, valid, stale)
	}
}

// Faults are intervals, charged to the holds they may have hit (charge):
// a hold that begins between the harness's stamp and the fault taking
// effect is hit; a takeover that no fault can explain is still a
// violation. Worker 7 is the one the faults strike; worker 1 takes over.
func TestCheckFaults(t *testing.T) {
	tests := []struct {
		name       string
		holds      []Hold
		faults     []fault
		fault      int64 // the Fault charged to holds[0]
		ok         bool
		violation  string
		max, valid int
		stale      int
	}{
		{
			name: "a freeze sent before the hold began, stopping it while it held",
			holds: []Hold{
				{Worker: 7, Slot: 0, Fence: 1, Call: 20, Acquired: 25, End: 200, Ended: true, Lost: true},
				{Worker: 1, Slot: 0, Fence: 2, Call: 30, Acquired: 150, End: 160, Ended: true},
			},
			faults: []fault{{worker: 7, kind: "freeze", begin: 10, stopped: 40, end: 140}},
			fault:  20, ok: true, max: 2, valid: 1, stale: 1,
		},
		{
			name: "a freeze stopping a hold inside Acquire, which returns after SIGCONT",
			holds: []Hold{
				{Worker: 7, Slot: 0, Fence: 1, Call: 5, Acquired: 145, End: 200, Ended: true, Lost: true},
				{Worker: 1, Slot: 0, Fence: 2, Call: 30, Acquired: 120, End: 130, Ended: true},
			},
			faults: []fault{{worker: 7, kind: "freeze", begin: 10, stopped: 40, end: 140}},
			fault:  10, ok: true, max: 1, valid: 1, stale: 1,
		},
		{
			name: "a kill sent before the hold began, landing while it held",
			holds: []Hold{
				{Worker: 7, Slot: 0, Fence: 1, Call: 20, Acquired: 25},
				{Worker: 1, Slot: 0, Fence: 2, Call: 30, Acquired: 60, End: 70, Ended: true},
			},
			faults: []fault{{worker: 7, kind: "kill", begin: 10, end: 50}},
			fault:  25, ok: true, max: 1, valid: 1,
		},
		{
			name: "a hold begun while its link was held",
			holds: []Hold{
				{Worker: 7, Slot: 0, Fence: 1, Call: 50, Acquired: 110, End: 300, Ended: true, Lost: true},
				{Worker: 1, Slot: 0, Fence: 2, Call: 60, Acquired: 200, End: 210, Ended: true},
			},
			faults: []fault{{worker: 7, kind: "delay", begin: 10, end: 100}},
			fault:  50, ok: true, max: 2, valid: 1, stale: 1,
		},
		{
			name: "a hold begun while the broker was down",
			holds: []Hold{
				{Worker: 7, Slot: 0, Fence: 1, Call: 50, Acquired: 120, End: 300, Ended: true, Lost: true},
				{Worker: 1, Slot: 0, Fence: 2, Call: 60, Acquired: 200, End: 210, Ended: true},
			},
			faults: []fault{{worker: -1, kind: "restart", begin: 10, end: 100}},
			fault:  50, ok: true, max: 2, valid: 1, stale: 1,
		},
		{
			name: "a freeze never seen to stop the worker, charged over its interval",
			holds: []Hold{
				{Worker: 7, Slot: 0, Fence: 1, Call: 50, Acquired: 55, End: 300, Ended: true, Lost: true},
				{Worker: 1, Slot: 0, Fence: 2, Call: 60, Acquired: 200, End: 210, Ended: true},
			},
			faults: []fault{{worker: 7, kind: "freeze", begin: 10, end: 100}},
			fault:  50, ok: true, max: 2, valid: 1, stale: 1,
		},
		{
			name: "the earliest of two faults",
			holds: []Hold{
				{Worker: 7, Slot: 0, Fence: 1, Call: 5, Acquired: 8},
				{Worker: 1, Slot: 0, Fence: 2, Call: 30, Acquired: 60, End: 70, Ended: true},
			},
			faults: []fault{
				{worker: 7, kind: "cut", begin: 20, end: 21},
				{worker: 7, kind: "kill", begin: 80, end: 90},
			},
			fault: 20, ok: true, max: 1, valid: 1,
		},
		{
			name: "a takeover of a hold that began after the freeze",
			holds: []Hold{
				{Worker: 7, Slot: 0, Fence: 1, Call: 139, Acquired: 145, End: 300, Ended: true, Lost: true},
				{Worker: 1, Slot: 0, Fence: 2, Call: 150, Acquired: 200, End: 210, Ended: true},
			},
			faults: []fault{{worker: 7, kind: "freeze", begin: 10, stopped: 40, end: 140}},
			ok:     false, violation: "while worker 7 held it", max: 2, valid: 1,
		},
		{
			name: "a takeover of a hold that ended before the freeze stopped its worker",
			holds: []Hold{
				{Worker: 7, Slot: 0, Fence: 1, Call: 5, Acquired: 8, End: 12, Ended: true, Lost: true},
				{Worker: 1, Slot: 0, Fence: 2, Call: 9, Acquired: 11, End: 30, Ended: true},
			},
			faults: []fault{{worker: 7, kind: "freeze", begin: 10, stopped: 20, end: 100}},
			ok:     false, violation: "while worker 7 held it", max: 2, valid: 1,
		},
		{
			name: "a takeover of a hold whose worker was killed after it said it ended",
			holds: []Hold{
				{Worker: 7, Slot: 0, Fence: 1, Call: 5, Acquired: 8, End: 40, Ended: true, Lost: true},
				{Worker: 1, Slot: 0, Fence: 2, Call: 30, Acquired: 35, End: 50, Ended: true},
			},
			faults: []fault{{worker: 7, kind: "kill", begin: 30, end: 45}},
			ok:     false, violation: "while worker 7 held it", max: 2, valid: 1,
		},
		{
			name: "a kill landing once a release it said it began had freed the slot",
			holds: []Hold{
				{Worker: 7, Slot: 0, Fence: 1, Call: 5, Acquired: 8, Releasing: 20},
				{Worker: 1, Slot: 0, Fence: 2, Call: 10, Acquired: 25, End: 30, Ended: true},
			},
			faults: []fault{{worker: 7, kind: "kill", begin: 28, end: 40}},
			fault:  28, ok: true, max: 1, valid: 1,
		},
		{
			name: "a kill landing after a takeover of a holder that never said it released",
			holds: []Hold{
				{Worker: 7, Slot: 0, Fence: 1, Call: 5, Acquired: 8},
				{Worker: 1, Slot: 0, Fence: 2, Call: 10, Acquired: 25, End: 30, Ended: true},
			},
			faults: []fault{{worker: 7, kind: "kill", begin: 28, end: 40}},
			fault:  28, ok: false, violation: "while worker 7 held it", max: 2, valid: 1,
		},
		{
			name: "a killed holder taken over before it said it held",
			holds: []Hold{
				{Worker: 7, Slot: 0, Fence: 1, Call: 20, Acquired: 60},
				{Worker: 1, Slot: 0, Fence: 2, Call: 30, Acquired: 40, End: 45, Ended: true},
			},
			faults: []fault{{worker: 7, kind: "kill", begin: 10, end: 70}},
			fault:  60, ok: false, violation: "while worker 7 held it", max: 1, valid: 1,
		},
		{
			name: "a takeover of a hold only another worker's fault overlaps",
			holds: []Hold{
				{Worker: 7, Slot: 0, Fence: 1, Call: 20, Acquired: 25, End: 300, Ended: true, Lost: true},
				{Worker: 1, Slot: 0, Fence: 2, Call: 30, Acquired: 200, End: 210, Ended: true},
			},
			faults: []fault{{worker: 3, kind: "delay", begin: 10, end: 300}},
			ok:     false, violation: "while worker 7 held it", max: 2, valid: 1,
		},
		{
			name: "a takeover of a hold that no fault interval overlaps",
			holds: []Hold{
				{Worker: 7, Slot: 0, Fence: 1, Call: 120, Acquired: 125, End: 300, Ended: true, Lost: true},
				{Worker: 1, Slot: 0, Fence: 2, Call: 130, Acquired: 200, End: 210, Ended: true},
			},
			faults: []fault{
				{worker: 7, kind: "delay", begin: 10, end: 100},
				{worker: -1, kind: "restart", begin: 310, end: 400},
			},
			ok: false, violation: "while worker 7 held it", max: 2, valid: 1,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			charge(tc.holds, tc.faults)
			if got := tc.holds[0].Fault; got != tc.fault {
				t.Errorf("fault charged to worker 7's hold: %d, want %d", got, tc.fault)
			}
			checkVerdict(t, Check(tc.holds, 2, 10*time.Second), tc.ok, tc.violation, tc.max, tc.valid, tc.stale)
		})
	}
}

// A killed holder's recovery runs from its death (not before it said it
// held) to the next fence's Acquire; a holder taken over before it died
// has none.
func TestRecoveries(t *testing.T) {
	kill := []fault{{worker: 7, kind: "kill", begin: 10, end: 50}}
	tests := []struct {
		name  string
		holds []Hold
		want  []time.Duration
	}{
		{"a kill landing on a hold begun after the stamp", []Hold{
			{Worker: 7, Slot: 0, Fence: 1, Call: 20, Acquired: 25},
			{Worker: 1, Slot: 0, Fence: 2, Call: 30, Acquired: 1025, End: 1100, Ended: true},
			{Worker: 2, Slot: 0, Fence: 3, Call: 1050, Acquired: 1110, End: 1200, Ended: true},
		}, []time.Duration{1000}},
		{"a killed holder already taken over", []Hold{
			{Worker: 7, Slot: 0, Fence: 1, Call: 0, Acquired: 2},
			{Worker: 1, Slot: 0, Fence: 2, Call: 3, Acquired: 5, End: 100, Ended: true},
		}, nil},
		{"a kill that found no hold", []Hold{
			{Worker: 7, Slot: 0, Fence: 1, Call: 0, Acquired: 2, End: 5, Ended: true},
			{Worker: 1, Slot: 0, Fence: 2, Call: 3, Acquired: 60, End: 100, Ended: true},
		}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := recoveries(tc.holds, kill); !slices.Equal(got, tc.want) {
				t.Errorf("recoveries %v, want %v", got, tc.want)
			}
		})
	}
}

// Two lives of a 2-permit semaphore: the first gone by 100, the second
// made at 110..120.
var twoLives = Timeline{Lives: []Life{
	{Created: 0, Ready: 5, Deleting: 90, Gone: 100, Permits: 2},
	{Created: 110, Ready: 120, Permits: 2},
}}

// CheckTimeline on hand-made histories of lives and resizes: each case
// names the rules that must fire (none: the history is safe) and a text
// the first violation must contain. Every rule that fires must be right
// about what it says; the comments say why each unsafe history is unsafe.
func TestCheckTimeline(t *testing.T) {
	shrink := Timeline{Lives: []Life{{Created: 0, Ready: 5, Permits: 4,
		Resizes: []Resize{{Begin: 100, End: 110, From: 4, To: 2}}}}, Converge: 50}
	grow := Timeline{Lives: []Life{{Created: 0, Ready: 5, Permits: 2,
		Resizes: []Resize{{Begin: 100, End: 110, From: 2, To: 4}}}}, Converge: 50}
	tests := []struct {
		name  string
		tl    Timeline
		holds []Hold
		ok    bool     // porcupine
		rules []string // the rules that fire, sorted
		text  string   // in the first violation
	}{
		{"the old life's holders told before the new life's holds", twoLives, []Hold{
			{Worker: 0, Slot: 0, Fence: 1, Call: 10, Acquired: 20, End: 95, Ended: true, Lost: true},
			{Worker: 1, Slot: 1, Fence: 1, Call: 10, Acquired: 20, End: 80, Ended: true},
			{Worker: 2, Slot: 0, Fence: 2, Call: 100, Acquired: 130, End: 140, Ended: true},
			{Worker: 3, Slot: 1, Fence: 2, Call: 125, Acquired: 130, End: 140, Ended: true},
		}, true, nil, ""},
		// Worker 1 still believed it held slot 1 of the first life when
		// worker 2 held slot 0 of the second, and nothing struck it.
		{"a new life's slot held before an old life's holder was told", twoLives, []Hold{
			{Worker: 1, Slot: 1, Fence: 1, Call: 10, Acquired: 20, End: 150, Ended: true, Lost: true},
			{Worker: 2, Slot: 0, Fence: 1, Call: 115, Acquired: 130, End: 140, Ended: true},
		}, true, []string{"seam"}, "worker 2 acquired slot 0 (fence 1, life 2) while worker 1 still held slot 1 (fence 1, life 1)"},
		{"an old life's frozen holder, told late", twoLives, []Hold{
			{Worker: 1, Slot: 1, Fence: 1, Call: 10, Acquired: 20, End: 150, Ended: true, Lost: true, Fault: 60},
			{Worker: 2, Slot: 0, Fence: 1, Call: 115, Acquired: 130, End: 140, Ended: true},
		}, true, nil, ""},
		// The same slot: the takeover rule names it, with the lives.
		{"a new life's holder of the slot an old life's holder still believed in", twoLives, []Hold{
			{Worker: 1, Slot: 0, Fence: 1, Call: 10, Acquired: 20, End: 150, Ended: true, Lost: true},
			{Worker: 2, Slot: 0, Fence: 2, Call: 115, Acquired: 130, End: 140, Ended: true},
		}, false, []string{"takeover"}, "slot 0: worker 2 acquired (fence 2, life 2) while worker 1 held it (fence 1, life 1)"},
		// Fence 3 came after fence 57 in time: the fence went back. The
		// holds do not overlap, so nothing else is wrong; ordering them by
		// fence would have made worker 0 a taker over worker 1.
		{"fences restarting in a new life", twoLives, []Hold{
			{Worker: 0, Slot: 0, Fence: 57, Call: 10, Acquired: 20, End: 30, Ended: true},
			{Worker: 1, Slot: 0, Fence: 3, Call: 120, Acquired: 130, End: 140, Ended: true},
		}, false, []string{"fence order"}, "slot 0: fence 3 (worker 1, life 2) after fence 57 (worker 0, life 1)"},
		{"fences given again in a new life", twoLives, []Hold{
			{Worker: 0, Slot: 0, Fence: 3, Call: 10, Acquired: 20, End: 30, Ended: true},
			{Worker: 1, Slot: 0, Fence: 3, Call: 120, Acquired: 130, End: 140, Ended: true},
		}, false, []string{"fence twice"}, "slot 0: fence 3 given twice (workers 0, life 1 and 1, life 2)"},
		{"fences going on across lives", twoLives, []Hold{
			{Worker: 0, Slot: 0, Fence: 3, Call: 10, Acquired: 20, End: 30, Ended: true},
			{Worker: 1, Slot: 0, Fence: 4, Call: 120, Acquired: 130, End: 140, Ended: true},
		}, true, nil, ""},
		// Between 100 and 110 no semaphore of the name existed.
		{"a take between lives", twoLives, []Hold{
			{Worker: 0, Slot: 0, Fence: 3, Call: 101, Acquired: 105, End: 130, Ended: true},
		}, true, []string{"no life"}, "worker 0 acquired slot 0 (fence 3) while no life of the semaphore existed"},
		// Worker 1's Acquire began in the first life and returned in the
		// second: it may have taken slot 0 of either, so worker 0, who
		// believed in slot 1 of the first until 150, is not named (had
		// worker 1 taken its permit in the first life, both held permits
		// of one life at once).
		{"a take straddling the seam, of either life", twoLives, []Hold{
			{Worker: 0, Slot: 1, Fence: 1, Call: 10, Acquired: 20, End: 150, Ended: true, Lost: true},
			{Worker: 1, Slot: 0, Fence: 1, Call: 50, Acquired: 130, End: 140, Ended: true},
		}, true, nil, ""},
		// Their takes overlap: by fence worker 0 took first, and worker 1
		// held while worker 0 still did; had worker 1 taken first, fence 1
		// would have come after fence 2. Unsafe either way, but which way
		// is not known.
		{"overlapping takes, ordered by fence", Fixed(2), []Hold{
			{Worker: 0, Slot: 0, Fence: 1, Call: 0, Acquired: 50, End: 100, Ended: true},
			{Worker: 1, Slot: 0, Fence: 2, Call: 10, Acquired: 20, End: 30, Ended: true},
		}, false, []string{"takeover or fence"}, "slot 0: either worker 1 acquired (fence 2) while worker 0 held it (fence 1) with no fault to excuse it, or fence 1 came after fence 2"},
		// The same fence twice, from overlapping takes: nothing orders
		// them, so only the fence is named.
		{"overlapping takes with one fence", Fixed(2), []Hold{
			{Worker: 0, Slot: 0, Fence: 3, Call: 0, Acquired: 50, End: 100, Ended: true},
			{Worker: 1, Slot: 0, Fence: 3, Call: 10, Acquired: 20, End: 30, Ended: true},
		}, false, []string{"fence twice"}, "slot 0: fence 3 given twice"},
		// Both held slot 0 at once, each from before the other's take
		// until after it: a takeover whichever took first.
		{"overlapping takes, each holding through the other's", Fixed(2), []Hold{
			{Worker: 0, Slot: 0, Fence: 1, Call: 0, Acquired: 50, End: 100, Ended: true},
			{Worker: 1, Slot: 0, Fence: 2, Call: 10, Acquired: 20, End: 60, Ended: true},
		}, false, []string{"takeover"}, "slot 0: workers 0 (fence 1) and 1 (fence 2) held it at once"},
		// The run that taught the checker this: worker 2's Acquire began
		// in the first life and returned in the second, with fence 2 (of
		// the second life's fresh queue); worker 3 held fence 13 in the
		// first. By fence worker 2 took first and was not freed when
		// worker 3 held; but more likely it took in the second life, and
		// the fence went back. Either way unsafe, and not a proven
		// takeover.
		{"a take of either life overlapping a take of one", twoLives, []Hold{
			{Worker: 3, Slot: 1, Fence: 13, Call: 40, Acquired: 45, End: 50, Ended: true},
			{Worker: 2, Slot: 1, Fence: 2, Call: 30, Acquired: 130, End: 140, Ended: true},
		}, false, []string{"takeover or fence"}, "slot 1: either worker 3 acquired (fence 13, life 1) while worker 2 held it (fence 2, life 1..2)"},
		{"old-count holders while clients learn a shrink", shrink, []Hold{
			{Worker: 0, Slot: 0, Fence: 1, Call: 0, Acquired: 90, End: 200, Ended: true},
			{Worker: 1, Slot: 1, Fence: 1, Call: 0, Acquired: 90, End: 200, Ended: true},
			{Worker: 2, Slot: 2, Fence: 1, Call: 0, Acquired: 90, End: 200, Ended: true},
			{Worker: 3, Slot: 3, Fence: 1, Call: 120, Acquired: 130, End: 200, Ended: true},
		}, true, nil, ""},
		// Slot 3 was taken at 190..195, 30 after every client admits by 2.
		{"a retired slot taken after the shrink converged", shrink, []Hold{
			{Worker: 3, Slot: 3, Fence: 1, Call: 190, Acquired: 195, End: 200, Ended: true},
		}, true, []string{"slot range"}, "worker 3 held slot 3 of 2"},
		// At 215, three holders admitted since every client admits by 2
		// (160), each running and told of nothing, beside one admitted by
		// 4 before the shrink. (Two of them share a slot: takeovers, which
		// the capacity rule always comes with, since each holder holds a
		// slot below its count.)
		{"more running holders than the count in force", shrink, []Hold{
			{Worker: 0, Slot: 3, Fence: 1, Call: 0, Acquired: 90, End: 300, Ended: true},
			{Worker: 1, Slot: 1, Fence: 1, Call: 200, Acquired: 201, End: 300, Ended: true},
			{Worker: 2, Slot: 1, Fence: 2, Call: 205, Acquired: 210, End: 300, Ended: true},
			{Worker: 3, Slot: 0, Fence: 1, Call: 205, Acquired: 215, End: 300, Ended: true},
		}, false, []string{"capacity", "takeover"}, "slot 1: worker 2 acquired (fence 2) while worker 1 held it (fence 1)"},
		// A holder admitted under 4 keeps its permit after the shrink:
		// Resize's contract.
		{"a holder of a retired slot admitted before the shrink", shrink, []Hold{
			{Worker: 0, Slot: 0, Fence: 1, Call: 0, Acquired: 10, End: 300, Ended: true},
			{Worker: 1, Slot: 1, Fence: 1, Call: 0, Acquired: 10, End: 300, Ended: true},
			{Worker: 3, Slot: 3, Fence: 1, Call: 0, Acquired: 10, End: 300, Ended: true},
		}, true, nil, ""},
		// A frozen holder does not count once the freeze began: the fence
		// is its remedy.
		{"a frozen holder beside the count in force", shrink, []Hold{
			{Worker: 0, Slot: 0, Fence: 1, Call: 0, Acquired: 10, End: 300, Ended: true, Lost: true, Fault: 150},
			{Worker: 1, Slot: 1, Fence: 1, Call: 200, Acquired: 201, End: 300, Ended: true},
			{Worker: 2, Slot: 0, Fence: 2, Call: 205, Acquired: 210, End: 300, Ended: true},
		}, true, nil, ""},
		{"a grown slot held", grow, []Hold{
			{Worker: 0, Slot: 3, Fence: 1, Call: 100, Acquired: 105, End: 130, Ended: true},
		}, true, nil, ""},
		// The second life has 2 permits; worker 0 called Acquire in it.
		{"a slot of the old life's count held in a smaller new life", Timeline{Lives: []Life{
			{Created: 0, Ready: 5, Deleting: 90, Gone: 100, Permits: 4},
			{Created: 110, Ready: 120, Permits: 2},
		}}, []Hold{
			{Worker: 0, Slot: 3, Fence: 9, Call: 130, Acquired: 140, End: 150, Ended: true},
		}, true, []string{"slot range"}, "worker 0 held slot 3 of 2, life 2"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := CheckTimeline(tc.holds, tc.tl, 10*time.Second)
			if got := v.Linearizable == porcupine.Ok; got != tc.ok {
				t.Errorf("linearizable = %v, want %v", v.Linearizable, tc.ok)
			}
			rules := slices.Sorted(maps.Keys(v.Counts))
			if !slices.Equal(rules, tc.rules) {
				t.Errorf("rules %q fired (%q), want %q", rules, v.Violations, tc.rules)
			}
			if tc.text != "" && (len(v.Violations) == 0 || !strings.Contains(v.Violations[0], tc.text)) {
				t.Errorf("violations %q, want the first to contain %q", v.Violations, tc.text)
			}
		})
	}
}

// The capacity rule names its episode once, with every holder and what it
// was admitted by.
func TestCheckCapacity(t *testing.T) {
	shrink := Timeline{Lives: []Life{{Created: 0, Ready: 5, Permits: 4,
		Resizes: []Resize{{Begin: 100, End: 110, From: 4, To: 2}}}}, Converge: 50}
	v := CheckTimeline([]Hold{
		{Worker: 0, Slot: 3, Fence: 1, Call: 0, Acquired: 90, End: 300, Ended: true},
		{Worker: 1, Slot: 1, Fence: 1, Call: 200, Acquired: 201, End: 300, Ended: true},
		{Worker: 2, Slot: 1, Fence: 2, Call: 205, Acquired: 210, End: 300, Ended: true},
		{Worker: 3, Slot: 0, Fence: 1, Call: 205, Acquired: 215, End: 250, Ended: true},
		{Worker: 4, Slot: 0, Fence: 2, Call: 205, Acquired: 220, End: 300, Ended: true},
	}, shrink, 10*time.Second)
	const want = "at +0.000 s, 4 holders held at once with no fault to excuse any, 3 of them admitted while at most 2 were allowed: " +
		"worker 1 slot 1 fence 1 admitted by 2; worker 2 slot 1 fence 2 admitted by 2; worker 3 slot 0 fence 1 admitted by 2; worker 0 slot 3 fence 1 admitted by 4"
	if v.Counts["capacity"] != 1 || !slices.Contains(v.Violations, want) {
		t.Errorf("violations %q, want one capacity episode: %q", v.Violations, want)
	}
	if v.MaxRunning != 5 {
		t.Errorf("max running %d, want 5", v.MaxRunning)
	}

	// One holder of the first life not told of its end, while holders of
	// the second (of 2) come and go: one episode, named once, though the
	// count dips to the bound between them.
	v = CheckTimeline([]Hold{
		{Worker: 0, Slot: 1, Fence: 1, Call: 10, Acquired: 20, End: 200, Ended: true, Lost: true},
		{Worker: 1, Slot: 0, Fence: 2, Call: 120, Acquired: 125, End: 130, Ended: true},
		{Worker: 2, Slot: 1, Fence: 2, Call: 120, Acquired: 126, End: 140, Ended: true},
		{Worker: 1, Slot: 0, Fence: 3, Call: 131, Acquired: 135, End: 150, Ended: true},
		{Worker: 3, Slot: 1, Fence: 3, Call: 141, Acquired: 145, End: 150, Ended: true},
	}, twoLives, 10*time.Second)
	if v.Counts["capacity"] != 1 {
		t.Errorf("violations %q, want one capacity episode", v.Violations)
	}
}

// The admission bound over time: the count in force, max(old, new) from a
// resize's call until Converge after its return, and max of two lives'
// counts from the delete until the new life is ready.
func TestTimelineBound(t *testing.T) {
	tl := Timeline{Lives: []Life{
		{Created: 0, Ready: 5, Deleting: 300, Gone: 320, Permits: 3,
			Resizes: []Resize{{Begin: 100, End: 110, From: 3, To: 5}, {Begin: 200, End: 210, From: 5, To: 2}}},
		{Created: 330, Ready: 340, Permits: 4},
	}, Converge: 50}
	spans := tl.spans()
	for _, c := range []struct {
		at   int64
		want int
	}{{0, 3}, {99, 3}, {100, 5}, {159, 5}, {160, 5}, {199, 5}, {200, 5}, {259, 5}, {260, 2}, {299, 2},
		{300, 4}, {325, 4}, {339, 4}, {340, 4}, {1000, 4}} {
		if got := boundAt(spans, c.at); got != c.want {
			t.Errorf("bound at %d = %d, want %d", c.at, got, c.want)
		}
	}
	if got := boundOver(spans, 250, 265); got != 5 {
		t.Errorf("bound over [250, 265] = %d, want 5", got)
	}
	for _, c := range []struct {
		call, acquired int64
		want           lives
	}{{10, 20, lives{0, 0}}, {310, 335, lives{0, 1}}, {321, 329, lives{2, -1}}, {335, 400, lives{1, 1}}} {
		if got := tl.livesOf(Hold{Call: c.call, Acquired: c.acquired}); got != c.want {
			t.Errorf("lives of a take in [%d, %d] = %v, want %v", c.call, c.acquired, got, c.want)
		}
	}
}

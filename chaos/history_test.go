package chaos

import (
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
		}, false, "while worker 0 held it", 2, 1, 0},
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
		}, false, "while worker 0 held it", 2, 1, 0},
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

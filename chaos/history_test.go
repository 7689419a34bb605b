package chaos

import (
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
			v := Check(tc.holds, 2, 10*time.Second)
			if got := v.Linearizable == porcupine.Ok; got != tc.ok {
				t.Errorf("linearizable = %v, want %v", v.Linearizable, tc.ok)
			}
			found := tc.violation == ""
			for _, s := range v.Violations {
				found = found || strings.Contains(s, tc.violation)
			}
			if !found || (tc.violation == "" && len(v.Violations) > 0) {
				t.Errorf("violations %q, want one containing %q", v.Violations, tc.violation)
			}
			if v.MaxHolders != tc.max || v.MaxValidHolders != tc.valid || v.StaleOverlaps != tc.stale {
				t.Errorf("max %d, valid %d, stale %d; want %d, %d, %d",
					v.MaxHolders, v.MaxValidHolders, v.StaleOverlaps, tc.max, tc.valid, tc.stale)
			}
		})
	}
}

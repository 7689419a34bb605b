package main

import (
	"strings"
	"testing"
	"time"
)

// The many-semaphores verdict says which half missed, and whether plain
// JetStream met that half in the same run (ours) or missed it too (the
// broker's).
func TestManySemsVerdict(t *testing.T) {
	for _, c := range []struct {
		name              string
		init, cycle       time.Duration
		floorCreate       time.Duration
		floorCycle, lone  time.Duration
		status            string
		whyHas, whyHasNot []string
	}{
		{"both met", 1900 * time.Microsecond, 150 * time.Microsecond, time.Millisecond, 120 * time.Microsecond, 80 * time.Microsecond,
			Met, nil, nil},
		{"create ours, cycle met", 2400 * time.Microsecond, 150 * time.Microsecond, time.Millisecond, 120 * time.Microsecond, 80 * time.Microsecond,
			Missed, []string{"create missed where plain JetStream meets it", "cycle met"}, []string{"broker"}},
		{"both the broker's", 2600 * time.Microsecond, 400 * time.Microsecond, 5600 * time.Microsecond, 370 * time.Microsecond, 80 * time.Microsecond,
			Missed, []string{"create missed, and plain JetStream misses it too", "cycle missed, and plain JetStream misses it too"}, []string{"natssem's"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &SystemResult{Label: "natssem", Grouped: true,
				Cycle:  &CycleResult{Summary: Summary{P50: 80 * time.Microsecond}},
				Sems:   &SemsResult{Count: manySemsGoal, Init: Summary{P50: c.init}, Cycle: Summary{P50: c.cycle}},
				PerKey: &PerKeyFloor{Count: manySemsGoal, Create: Summary{P50: c.floorCreate}, Lone: Summary{P50: c.lone}, Cycle: Summary{P50: c.floorCycle}},
			}
			var ts []Target
			addManySems(&ts, s)
			if len(ts) != 1 || ts[0].Status != c.status {
				t.Fatalf("targets %+v, want one %s", ts, c.status)
			}
			for _, w := range c.whyHas {
				if !strings.Contains(ts[0].Why, w) {
					t.Errorf("why %q lacks %q", ts[0].Why, w)
				}
			}
			for _, w := range c.whyHasNot {
				if strings.Contains(ts[0].Why, w) {
					t.Errorf("why %q has %q", ts[0].Why, w)
				}
			}
		})
	}
}

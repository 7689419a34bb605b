package adaptive

import (
	"testing"
	"time"
)

// TestFleetCarriesALateProcess: a process whose report misses one of the
// controller's windows (its timer runs a moment behind) keeps its Busy in
// that window, once; its holds are not counted twice; a process silent
// for longer drops out; a report noted (one that came during a resize)
// counts its level, not its holds.
func TestFleetCarriesALateProcess(t *testing.T) {
	w := time.Second
	f := fleet{window: w, busy: map[string]level{}}
	t0 := time.Now()
	rep := func(from string, busy float64, holds int) Report {
		return Report{From: from, Sample: Sample{Busy: busy, Holds: holds, RTT: 10 * time.Millisecond}}
	}
	s := f.sample(t0, []Report{rep("a", 3, 30), rep("b", 5, 50), rep("b", 7, 70)})
	if s.Busy != 3+6 || s.Holds != 150 {
		t.Fatalf("a at 3, b twice at 5 and 7: %+v, want Busy 9 (b's mean), 150 holds", s)
	}
	s = f.sample(t0.Add(w), []Report{rep("a", 4, 40)})
	if s.Busy != 4+6 || s.Holds != 40 {
		t.Fatalf("b late: %+v, want Busy 10 (b's last level carried), 40 holds (b's not counted again)", s)
	}
	s = f.sample(t0.Add(2*w), []Report{rep("a", 4, 40)})
	if s.Busy != 4 {
		t.Fatalf("b silent for two windows: %+v, want Busy 4 (b dropped)", s)
	}
	f.note(t0.Add(2*w+w/10), []Report{rep("b", 2, 20)})
	if s := f.sample(t0.Add(3*w), []Report{rep("a", 5, 50)}); s.Busy != 5+2 || s.Holds != 50 {
		t.Fatalf("b noted during a resize: %+v, want Busy 7 (b's noted level carried), 50 holds", s)
	}
}

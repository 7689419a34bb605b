package adaptive_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/tokensem/tokensem/adaptive"
)

// downstream is a closed-loop model of what a fleet's permits protect: C
// workers, each serving a hold in S; holds beyond C queue, and one that
// would queue longer than Q is refused (a drop). The fleet keeps as many
// holds in flight as it has permits (demand always exceeds the limit).
type downstream struct {
	C    int
	S, Q time.Duration
	rng  *rand.Rand
}

// window plays one second at limit l.
func (d *downstream) window(l int) adaptive.Sample {
	served := min(l, d.C)
	rtt := d.S
	var drops int
	if l > d.C {
		wait := time.Duration(float64(d.S) * float64(l-d.C) / float64(d.C))
		if wait > d.Q {
			// The holds beyond the queue the downstream keeps are refused.
			kept := d.C + int(float64(d.Q)*float64(d.C)/float64(d.S))
			drops = (l - kept) * int(time.Second/d.S)
			wait = d.Q
		}
		rtt += wait
	}
	rtt = time.Duration(float64(rtt) * (0.97 + 0.06*d.rng.Float64())) // ±3 % noise
	return adaptive.Sample{Limit: l, Busy: float64(l), RTT: rtt, Holds: served * int(time.Second/d.S), Drops: drops}
}

// TestSettlesOnCapacity: each algorithm, fed one sample a second by a
// downstream whose capacity goes 12 → 6 → 16, settles within 20% of it
// within 10 windows of each change and stays there (the targets of the
// bench's adaptive scenario, here on a model rather than real holds).
func TestSettlesOnCapacity(t *testing.T) {
	for _, tc := range []struct {
		name string
		alg  adaptive.Algorithm
	}{
		{"AIMD", &adaptive.AIMD{}},
		{"Gradient", &adaptive.Gradient{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &downstream{S: 20 * time.Millisecond, Q: 2 * time.Millisecond, rng: rand.New(rand.NewPCG(1, 2))}
			bounds := adaptive.Bounds{Min: 1, Max: 64}
			limit := 4
			var trace []string
			for _, c := range []int{12, 6, 16} {
				d.C = c
				for w := range 30 {
					s := d.window(limit)
					limit = bounds.Apply(limit, tc.alg.Next(s))
					trace = append(trace, fmt.Sprint(limit))
					if w >= 10 && (float64(limit) < 0.8*float64(c) || float64(limit) > 1.2*float64(c)) {
						t.Fatalf("capacity %d, window %d after the change: limit %d, outside 20%%; limits so far: %s",
							c, w, limit, strings.Join(trace, " "))
					}
				}
			}
			t.Logf("limits: %s", strings.Join(trace, " "))
		})
	}
}

// TestAppLimitedKeepsTheLimit: a fleet that uses less than half its
// permits gives no evidence about the downstream: the limit stays.
func TestAppLimitedKeepsTheLimit(t *testing.T) {
	for _, alg := range []adaptive.Algorithm{&adaptive.AIMD{}, &adaptive.Gradient{}} {
		s := adaptive.Sample{Limit: 20, Busy: 3, RTT: 10 * time.Millisecond, Holds: 300}
		for range 5 {
			if got := alg.Next(s); got != 20 {
				t.Fatalf("%T with 3 of 20 permits in use: limit %d, want 20", alg, got)
			}
		}
		if got := alg.Next(adaptive.Sample{Limit: 20}); got != 20 {
			t.Fatalf("%T with no hold in the window: limit %d, want 20", alg, got)
		}
	}
}

func TestBounds(t *testing.T) {
	b := adaptive.Bounds{Min: 2, Max: 10, MaxStep: 3}
	for _, tc := range []struct{ cur, next, want int }{{5, 9, 8}, {5, 1, 2}, {9, 30, 10}, {5, 6, 6}} {
		if got := b.Apply(tc.cur, tc.next); got != tc.want {
			t.Errorf("Apply(%d, %d) = %d, want %d", tc.cur, tc.next, got, tc.want)
		}
	}
	for _, bad := range []adaptive.Bounds{{Min: 0, Max: 3}, {Min: 4, Max: 3}, {Min: 1, Max: 3, MaxStep: -1}} {
		if bad.Validate() == nil {
			t.Errorf("%+v: valid", bad)
		}
	}
}

// TestAIMDDropRatio: with a DropRatio, a window whose overloads stay at or
// below that share of its holds grows the limit; one above it backs off.
func TestAIMDDropRatio(t *testing.T) {
	a := &adaptive.AIMD{DropRatio: 0.01}
	s := adaptive.Sample{Limit: 10, Busy: 10, RTT: time.Millisecond, Holds: 1000, Drops: 10}
	if got := a.Next(s); got != 11 {
		t.Fatalf("10 drops in 1,000 holds, ratio 0.01: limit %d, want 11", got)
	}
	s.Drops = 11
	if got := a.Next(s); got != 9 {
		t.Fatalf("11 drops in 1,000 holds, ratio 0.01: limit %d, want 9", got)
	}
	if got := (&adaptive.AIMD{}).Next(adaptive.Sample{Limit: 10, Busy: 10, Holds: 1000, Drops: 1}); got != 9 {
		t.Fatalf("one drop, no ratio: limit %d, want 9", got)
	}
}

package main

import (
	"errors"
	"math"
	"sync"
	"testing"
	"time"
)

func ms(v ...int) []time.Duration {
	d := make([]time.Duration, len(v))
	for i, x := range v {
		d[i] = time.Duration(x) * time.Millisecond
	}
	return d
}

func TestPercentile(t *testing.T) {
	tests := []struct {
		name string
		d    []time.Duration
		p    float64
		want time.Duration
	}{
		{"empty", nil, 0.5, 0},
		{"one", ms(7), 0.99, 7 * time.Millisecond},
		{"median of odd", ms(5, 1, 3), 0.5, 3 * time.Millisecond},
		{"median of even is the lower middle", ms(4, 1, 3, 2), 0.5, 2 * time.Millisecond},
		{"p99 of 100 is the 99th", seq(100), 0.99, 99 * time.Millisecond},
		{"p99 of 1000 is the 990th", seq(1000), 0.99, 990 * time.Millisecond},
		{"p100 is the max", ms(2, 9, 4), 1, 9 * time.Millisecond},
		{"tiny p is the min", ms(2, 9, 4), 0.0001, 2 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			orig := append([]time.Duration(nil), tt.d...)
			if got := Percentile(tt.d, tt.p); got != tt.want {
				t.Errorf("Percentile(%v, %v) = %v, want %v", tt.d, tt.p, got, tt.want)
			}
			for i := range orig {
				if orig[i] != tt.d[i] {
					t.Fatalf("Percentile reordered its input")
				}
			}
		})
	}
}

// seq returns 1..n ms, shuffled deterministically.
func seq(n int) []time.Duration {
	d := make([]time.Duration, n)
	for i := range d {
		d[(i*7919)%n] = time.Duration(i+1) * time.Millisecond
	}
	return d
}

func TestSummarize(t *testing.T) {
	s := Summarize(seq(200))
	if s.N != 200 || s.P50 != 100*time.Millisecond || s.P90 != 180*time.Millisecond ||
		s.P99 != 198*time.Millisecond || s.Max != 200*time.Millisecond {
		t.Errorf("Summarize = %+v", s)
	}
	if want := 100500 * time.Microsecond; s.Mean != want {
		t.Errorf("mean = %v, want %v", s.Mean, want)
	}
	if (Summarize(nil) != Summary{}) {
		t.Errorf("Summarize(nil) is not zero")
	}
}

func TestFairnessOf(t *testing.T) {
	tests := []struct {
		name   string
		counts []int
		maxMin float64
		cv     float64
	}{
		{"even", []int{10, 10, 10, 10}, 1, 0},
		{"two to one", []int{10, 20}, 2, 1.0 / 3},
		{"starved worker", []int{0, 5, 5}, math.Inf(1), math.Sqrt(50.0/9) / (10.0 / 3)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := FairnessOf(tt.counts)
			if f.MaxMin != tt.maxMin && !(math.IsInf(f.MaxMin, 1) && math.IsInf(tt.maxMin, 1)) {
				t.Errorf("MaxMin = %v, want %v", f.MaxMin, tt.maxMin)
			}
			if math.Abs(f.CV-tt.cv) > 1e-9 {
				t.Errorf("CV = %v, want %v", f.CV, tt.cv)
			}
		})
	}
}

func TestMeterPeak(t *testing.T) {
	var m Meter
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for range 8 {
		wg.Go(func() {
			m.Enter()
			<-gate
			m.Leave()
		})
	}
	for m.cur.Load() != 8 {
		time.Sleep(time.Millisecond)
	}
	close(gate)
	wg.Wait()
	m.Enter()
	m.Leave()
	if m.Peak() != 8 {
		t.Errorf("peak = %d, want 8", m.Peak())
	}
}

func TestFormatting(t *testing.T) {
	for _, tt := range []struct {
		got, want string
	}{
		{fmtDur(33 * time.Microsecond), "33.0 µs"},
		{fmtDur(412 * time.Microsecond), "412 µs"},
		{fmtDur(1700 * time.Microsecond), "1.70 ms"},
		{fmtDur(2500 * time.Millisecond), "2.50 s"},
		{fmtDur(0), "0"},
		{fmtBytes(512), "512 B"},
		{fmtBytes(2.5 * 1024), "2.50 KiB"},
		{thousands(4000), "4,000"},
		{thousands(1234567.4), "1,234,567"},
		{thousands(999), "999"},
		{thousands(-1500), "-1,500"},
	} {
		if tt.got != tt.want {
			t.Errorf("got %q, want %q", tt.got, tt.want)
		}
	}
}

func TestHoldFor(t *testing.T) {
	for _, precise := range []bool{true, false} {
		t0 := time.Now()
		holdFor(2*time.Millisecond, precise)
		if d := time.Since(t0); d < 2*time.Millisecond || d > 500*time.Millisecond {
			t.Errorf("holdFor(2ms, precise=%v) took %v", precise, d)
		}
	}
}

func TestJoinDistinct(t *testing.T) {
	if joinDistinct([]error{nil, nil}) != nil {
		t.Error("no errors: not nil")
	}
	a, b := errors.New("gone"), errors.New("closed")
	got := joinDistinct([]error{a, nil, a, b, a}).Error()
	if want := "gone (3 workers)\nclosed"; got != want {
		t.Errorf("joinDistinct = %q, want %q", got, want)
	}
}

package main

import (
	"fmt"
	"math"
	"slices"
	"sync/atomic"
	"time"
)

// Percentile returns the nearest-rank p-quantile (0 < p ≤ 1) of d: the
// smallest sample such that at least p of the samples are ≤ it. It returns
// 0 for no samples. d is not modified.
func Percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return percentileSorted(s, p)
}

func percentileSorted(s []time.Duration, p float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	rank := int(math.Ceil(p * float64(len(s))))
	rank = min(max(rank, 1), len(s))
	return s[rank-1]
}

// Summary is the distribution of a set of latency samples.
type Summary struct {
	N                  int
	P50, P90, P99, Max time.Duration
	Mean               time.Duration
}

// Summarize computes the summary of d (zero for no samples).
func Summarize(d []time.Duration) Summary {
	if len(d) == 0 {
		return Summary{}
	}
	s := slices.Clone(d)
	slices.Sort(s)
	var sum time.Duration
	for _, v := range s {
		sum += v
	}
	return Summary{
		N:    len(s),
		P50:  percentileSorted(s, 0.50),
		P90:  percentileSorted(s, 0.90),
		P99:  percentileSorted(s, 0.99),
		Max:  s[len(s)-1],
		Mean: sum / time.Duration(len(s)),
	}
}

// Fairness describes how evenly acquisitions were spread over workers.
type Fairness struct {
	Min, Max int
	// MaxMin is Max/Min (+Inf when a worker never acquired).
	MaxMin float64
	// CV is the coefficient of variation of the per-worker counts:
	// population standard deviation / mean (0 = perfectly even).
	CV float64
}

// FairnessOf computes the spread of per-worker acquisition counts.
func FairnessOf(counts []int) Fairness {
	if len(counts) == 0 {
		return Fairness{}
	}
	f := Fairness{Min: slices.Min(counts), Max: slices.Max(counts)}
	if f.Min == 0 {
		f.MaxMin = math.Inf(1)
	} else {
		f.MaxMin = float64(f.Max) / float64(f.Min)
	}
	var sum float64
	for _, c := range counts {
		sum += float64(c)
	}
	mean := sum / float64(len(counts))
	if mean == 0 {
		return f
	}
	var ss float64
	for _, c := range counts {
		ss += (float64(c) - mean) * (float64(c) - mean)
	}
	f.CV = math.Sqrt(ss/float64(len(counts))) / mean
	return f
}

// Meter counts callers holding a permit now and remembers the most seen at
// once. Enter right after Acquire returns, Leave right before Release: the
// count then never under-reports the holders at any instant.
type Meter struct {
	cur, peak atomic.Int64
}

// Enter records one more holder.
func (m *Meter) Enter() {
	c := m.cur.Add(1)
	for {
		p := m.peak.Load()
		if c <= p || m.peak.CompareAndSwap(p, c) {
			return
		}
	}
}

// Leave records one holder fewer.
func (m *Meter) Leave() { m.cur.Add(-1) }

// Peak returns the most holders seen at once.
func (m *Meter) Peak() int { return int(m.peak.Load()) }

// fmtDur prints a latency with three significant digits in µs, ms or s.
func fmtDur(d time.Duration) string {
	switch {
	case d <= 0:
		return "0"
	case d < time.Millisecond:
		return sig3(float64(d)/float64(time.Microsecond)) + " µs"
	case d < time.Second:
		return sig3(float64(d)/float64(time.Millisecond)) + " ms"
	default:
		return sig3(d.Seconds()) + " s"
	}
}

// sig3 formats v (≥ 0) with about three significant digits.
func sig3(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

// fmtBytes prints a byte count in B, KiB or MiB.
func fmtBytes(b float64) string {
	switch {
	case b < 1024:
		return fmt.Sprintf("%.0f B", b)
	case b < 1024*1024:
		return sig3(b/1024) + " KiB"
	default:
		return sig3(b/(1024*1024)) + " MiB"
	}
}

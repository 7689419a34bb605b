// Package benchtest measures any tokensem.Semaphore the same way, so that
// the benchmarks of every backend (go test -bench) report comparable
// figures: an acquire/release cycle, a hand-off to a queued waiter, a
// weighted acquire.
package benchtest

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/tokensem/tokensem"
)

// Percentile returns the p-quantile (0..1) of d.
func Percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[int(float64(len(s)-1)*p)]
}

// BenchCycle measures one client's Acquire+Release on s, the same way for
// every backend. It reports p50-µs, p99-µs and acquire-µs (mean) and returns
// the p50.
func BenchCycle(b *testing.B, s tokensem.Semaphore) time.Duration {
	ctx := context.Background()
	var d []time.Duration
	var acq time.Duration
	for b.Loop() {
		t0 := time.Now()
		p, err := s.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		acq += time.Since(t0)
		if err := p.Release(ctx); err != nil {
			b.Fatal(err)
		}
		d = append(d, time.Since(t0))
	}
	p50 := Percentile(d, 0.5)
	b.ReportMetric(float64(p50.Microseconds()), "p50-µs")
	b.ReportMetric(float64(Percentile(d, 0.99).Microseconds()), "p99-µs")
	b.ReportMetric(float64(acq.Microseconds())/float64(len(d)), "acquire-µs")
	return p50
}

// BenchHandoff measures release → blocked waiter: holder holds the only
// permit, waiter (another connection) waits until queued reports the
// broker counts it, and the time runs from the holder's Release call to the
// waiter holding the permit. queued must be cheap and must not disturb the
// semaphore (no Status census).
//
// settled (nil: none) is polled after the holder acquired and before the
// waiter starts, for brokers whose waiter count lags (a quorum queue counts
// the holder of an unacked token as a consumer, and drops the previous
// round's holder about 1.5 ms after its release); queued is polled after
// the waiter started, until the broker counts it.
func BenchHandoff(b *testing.B, holder, waiter tokensem.Semaphore, settled, queued func() bool) {
	ctx := context.Background()
	type got struct {
		p  tokensem.Permit
		at time.Time
	}
	var d []time.Duration
	for b.Loop() {
		b.StopTimer()
		held, err := holder.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if settled != nil {
			poll(b, "the broker's count never settled", settled)
		}
		ch := make(chan got, 1)
		go func() {
			p, err := waiter.Acquire(ctx)
			if err != nil {
				b.Error(err)
			}
			ch <- got{p, time.Now()}
		}()
		poll(b, "waiter never queued", queued)
		b.StartTimer()
		t0 := time.Now()
		if err := held.Release(ctx); err != nil {
			b.Fatal(err)
		}
		g := <-ch
		d = append(d, g.at.Sub(t0))
		b.StopTimer()
		if g.p != nil {
			_ = g.p.Release(ctx)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(Percentile(d, 0.5).Microseconds()), "p50-µs")
	b.ReportMetric(float64(Percentile(d, 0.99).Microseconds()), "p99-µs")
}

// poll calls cond every 100 µs until it holds, for at most 10 s.
func poll(b *testing.B, failure string, cond func() bool) {
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			b.Fatal(failure)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// BenchWeighted compares, on one idle client of s, holding k permits with
// one AcquireN + Release of the set against k Acquire calls one after the
// other + k Releases. It reports p50-µs and p99-µs.
func BenchWeighted(b *testing.B, s tokensem.Weighted, k int, singles bool) {
	ctx := context.Background()
	var d []time.Duration
	for b.Loop() {
		t0 := time.Now()
		if singles {
			ps := make([]tokensem.Permit, 0, k)
			for range k {
				p, err := s.Acquire(ctx)
				if err != nil {
					b.Fatal(err)
				}
				ps = append(ps, p)
			}
			for _, p := range ps {
				if err := p.Release(ctx); err != nil {
					b.Fatal(err)
				}
			}
		} else {
			set, err := s.AcquireN(ctx, k)
			if err != nil {
				b.Fatal(err)
			}
			if err := set.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
		d = append(d, time.Since(t0))
	}
	b.ReportMetric(float64(Percentile(d, 0.5).Microseconds()), "p50-µs")
	b.ReportMetric(float64(Percentile(d, 0.99).Microseconds()), "p99-µs")
}

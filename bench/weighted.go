package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/tokensem/tokensem"
)

// The mixed-weight scenario: workers of weights 1, 2 and 3 loop
// AcquireN(k) → hold → Release on one semaphore of N permits (tokensem
// only: the Redis semaphore has no weighted acquire).

// weightedSem is a Sem that can hold several permits at once.
type weightedSem interface {
	AcquireN(ctx context.Context, k int) (Held, error)
}

func (t tokenSem) AcquireN(ctx context.Context, k int) (Held, error) {
	w, ok := t.s.(tokensem.Weighted)
	if !ok {
		return nil, fmt.Errorf("%T has no weighted acquire", t.s)
	}
	set, err := w.AcquireN(ctx, k)
	if err != nil {
		return nil, err
	}
	if t.onHold != nil {
		for _, p := range set.Permits() {
			t.onHold(p)
		}
	}
	return set, nil
}

// weights are the workers' weights, in turn.
var weights = []int{1, 2, 3}

// WeightedResult is the outcome of the mixed-weight scenario.
type WeightedResult struct {
	Workers, N     int
	Hold, Duration time.Duration
	Units          float64 // permits' weight acquired per second
	Ceiling        float64 // N / hold
	Peak           int     // most weight inside at once (atomic meter)
	Classes        []WeightClass
	CPU            CPUUse
}

// WeightClass is what the workers of one weight got.
type WeightClass struct {
	K, Workers, Acquisitions int
	Wait                     Summary
}

// Percent is Units as a share of the ceiling.
func (r *WeightedResult) Percent() float64 { return 100 * r.Units / r.Ceiling }

func runWeighted(ctx context.Context, sys System, name string, workers, n int, hold, dur time.Duration, precise bool) (*WeightedResult, error) {
	opened, done, err := openWorkers(ctx, sys, name, workers, n, func(i int, s Sem) (Held, error) {
		w, ok := s.(weightedSem)
		if !ok {
			return nil, errors.ErrUnsupported
		}
		return w.AcquireN(ctx, weights[i%len(weights)]) // the first one makes the gate
	})
	if err != nil {
		return nil, err
	}
	defer done()
	sems := make([]weightedSem, workers)
	for i, s := range opened {
		sems[i] = s.(weightedSem)
	}

	var m Meter
	counts := make([]int, workers)
	waits := make([][]time.Duration, workers)
	errs := make([]error, workers)
	cpu := startCPU()
	start := time.Now()
	deadline := start.Add(dur)
	wctx, cancel := context.WithDeadline(ctx, deadline.Add(30*time.Second))
	defer cancel()
	var wg sync.WaitGroup
	for w := range workers {
		k := weights[w%len(weights)]
		wg.Go(func() {
			for {
				t0 := time.Now()
				if !t0.Before(deadline) {
					return
				}
				h, err := sems[w].AcquireN(wctx, k)
				if err != nil {
					errs[w] = err
					return
				}
				got := time.Now()
				for range k {
					m.Enter()
				}
				holdFor(hold, precise)
				for range k {
					m.Leave()
				}
				if err := h.Release(wctx); err != nil {
					errs[w] = err
					return
				}
				if got.Before(deadline) {
					counts[w]++
					waits[w] = append(waits[w], got.Sub(t0))
				}
			}
		})
	}
	wg.Wait()
	use := cpu.Stop()
	if err := joinDistinct(errs); err != nil {
		return nil, err
	}
	r := &WeightedResult{Workers: workers, N: n, Hold: hold, Duration: dur, Peak: m.Peak(),
		Ceiling: float64(n) / hold.Seconds(), CPU: use}
	units := 0
	for _, k := range weights {
		c := WeightClass{K: k}
		var ws []time.Duration
		for w := range workers {
			if weights[w%len(weights)] == k {
				c.Workers++
				c.Acquisitions += counts[w]
				ws = append(ws, waits[w]...)
			}
		}
		c.Wait = Summarize(ws)
		units += k * c.Acquisitions
		r.Classes = append(r.Classes, c)
	}
	r.Units = float64(units) / dur.Seconds()
	return r, nil
}

// writeWeighted writes the mixed-weight table, if the scenario ran.
func writeWeighted(w io.Writer, r *Report) {
	var systems []*SystemResult
	for _, s := range r.Systems {
		if s.Skipped == "" && (s.Weighted != nil || s.Errs["weighted"] != "") {
			systems = append(systems, s)
		}
	}
	if len(systems) == 0 {
		return
	}
	fmt.Fprintf(w, "## Mixed weights\n\n")
	var rows [][]string
	for _, s := range systems {
		wr := s.Weighted
		if wr == nil {
			rows = append(rows, []string{s.Label, "failed: " + s.Errs["weighted"]})
			continue
		}
		row := []string{s.Label,
			fmt.Sprintf("%s/s (%.0f%%)", thousands(wr.Units), wr.Percent()),
			fmt.Sprintf("%d of %d", wr.Peak, wr.N)}
		for _, c := range wr.Classes {
			row = append(row, fmt.Sprintf("%d holds; %s / %s", c.Acquisitions, fmtDur(c.Wait.P50), fmtDur(c.Wait.P99)))
		}
		rows = append(rows, row)
	}
	header := []string{"system", "permits' weight per second (share of N/hold)", "most weight inside"}
	for _, k := range weights {
		header = append(header, fmt.Sprintf("weight %d: holds; wait p50 / p99", k))
	}
	writeTable(w, header, rows)
	wr := systems[0].Weighted
	if wr != nil {
		fmt.Fprintf(w, "%d workers on connections of their own, weights %v in turn, loop AcquireN(k) → hold %s → Release "+
			"on N=%d for %s. Callers of more than one permit take turns through the semaphore's gate, so a weight-3 caller "+
			"gathers while smaller ones wait for it: the permits it already holds sit idle meanwhile, which is the price of "+
			"neither deadlocking nor starving the big callers.\n\n",
			wr.Workers, weights, fmtDur(wr.Hold), wr.N, wr.Duration)
	}
}

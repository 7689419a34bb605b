package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/tokensem/tokensem"
)

// The priority scenario: low-class workers keep N permits busy (acquire →
// hold → release, on connections of their own) while one high-class
// caller arrives every interval, holds as long and leaves. It runs twice
// per tokensem system: with classes (the workers in class -1, the caller
// in class 3: the broker serves the caller first) and without (everyone
// in class 0: the caller waits its turn, FIFO), and once for a system
// without classes (Redis: FIFO only).

// Classes of the scenario's callers.
const (
	lowClass  tokensem.Priority = -1
	highClass tokensem.Priority = 3
)

// PriorityResult is one run of the priority scenario.
type PriorityResult struct {
	Classes       bool // the callers waited in their classes; false: all in class 0
	Workers, N    int
	Hold, Every   time.Duration
	Duration      time.Duration
	Low, High     Summary // waits
	LowThroughput float64 // low-class acquisitions per second
	HighAcquired  int
	Peak          int // most holders at once (Meter)
	CPU           CPUUse
	// Probe is the handoff to an idle waiter of a semaphore of its own,
	// measured on the same broker beside the run: one handoff under the
	// run's load.
	Probe       *HandoffResult
	ProbeFailed string // why Probe is nil, when it failed
}

func runPriority(ctx context.Context, sys System, name string, workers, n int, hold, every, dur time.Duration, classes, precise bool) (*PriorityResult, error) {
	// One more handle than workers: the high-class caller's.
	sems, done, err := openWorkers(ctx, sys, name, workers+1, n, func(_ int, s Sem) (Held, error) { return s.Acquire(ctx) })
	if err != nil {
		return nil, err
	}
	defer done()
	low, high := ctx, ctx
	if classes {
		low, high = tokensem.WithPriority(ctx, lowClass), tokensem.WithPriority(ctx, highClass)
	}

	var m Meter
	lowWaits := make([][]time.Duration, workers)
	var highWaits []time.Duration
	errs := make([]error, workers+1)
	cpu := startCPU()
	start := time.Now()
	deadline := start.Add(dur)
	var wg sync.WaitGroup
	var probe *HandoffResult
	var probeErr error
	wg.Go(func() {
		pctx, cancel := context.WithDeadline(ctx, deadline.Add(30*time.Second))
		defer cancel()
		probe, probeErr = handoffProbe(pctx, sys, name+"-probe", deadline, every, time.Millisecond)
	})
	cycle := func(ctx context.Context, s Sem) (time.Duration, bool, error) {
		t0 := time.Now()
		actx, cancel := context.WithDeadline(ctx, deadline.Add(30*time.Second))
		defer cancel()
		h, err := s.Acquire(actx)
		if err != nil {
			return 0, false, err
		}
		got := time.Now()
		m.Enter()
		holdFor(hold, precise)
		m.Leave()
		if err := h.Release(actx); err != nil {
			return 0, false, err
		}
		return got.Sub(t0), got.Before(deadline), nil
	}
	for w := range workers {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				wait, in, err := cycle(low, sems[w])
				if err != nil {
					errs[w] = err
					return
				}
				if in {
					lowWaits[w] = append(lowWaits[w], wait)
				}
			}
		})
	}
	wg.Go(func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for time.Now().Before(deadline) {
			select {
			case <-tick.C:
			case <-ctx.Done():
				return
			}
			wait, in, err := cycle(high, sems[workers])
			if err != nil {
				errs[workers] = err
				return
			}
			if in {
				highWaits = append(highWaits, wait)
			}
		}
	})
	wg.Wait()
	use := cpu.Stop()
	if err := joinDistinct(errs); err != nil {
		return nil, err
	}
	var probeFailed string
	if probeErr != nil {
		probe, probeFailed = nil, probeErr.Error() // the run stands; its table says so
	}
	var all []time.Duration
	for _, ws := range lowWaits {
		all = append(all, ws...)
	}
	return &PriorityResult{Classes: classes, Workers: workers, N: n, Hold: hold, Every: every, Duration: dur,
		Low: Summarize(all), High: Summarize(highWaits), LowThroughput: float64(len(all)) / dur.Seconds(),
		HighAcquired: len(highWaits), Peak: m.Peak(), CPU: use, Probe: probe, ProbeFailed: probeFailed}, nil
}

// writePriority writes the priority table, if the scenario ran.
func writePriority(w io.Writer, r *Report) {
	var rows [][]string
	var first *PriorityResult
	for _, s := range r.Systems {
		if s.Skipped != "" {
			continue
		}
		if e := s.Errs["priority"]; e != "" {
			rows = append(rows, []string{s.Label, "failed: " + e})
		}
		for _, pr := range []*PriorityResult{s.PriorityFIFO, s.Priority} {
			if pr == nil {
				continue
			}
			if first == nil {
				first = pr
			}
			mode := "all in class 0 (FIFO)"
			if pr.Classes {
				mode = fmt.Sprintf("workers %d, caller %d", lowClass, highClass)
			}
			share := "—"
			if pr.Classes && s.PriorityFIFO != nil && s.PriorityFIFO.LowThroughput > 0 {
				share = fmt.Sprintf("%.0f%%", 100*pr.LowThroughput/s.PriorityFIFO.LowThroughput)
			}
			rows = append(rows, []string{s.Label, mode,
				fmtDur(pr.High.P50) + " / " + fmtDur(pr.High.P99) + fmt.Sprintf(" (%d)", pr.HighAcquired),
				priorityTarget(r, s, pr),
				fmtDur(pr.Low.P50) + " / " + fmtDur(pr.Low.P99),
				fmt.Sprintf("%s/s", thousands(pr.LowThroughput)), share,
				fmt.Sprintf("%d of %d", pr.Peak, pr.N)})
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "## Priority classes\n\n")
	writeTable(w, []string{"system", "classes", "caller's wait p50 / p99 (calls)", "target for its p99",
		"workers' wait p50 / p99", "workers' throughput", "of FIFO's", "most inside"}, rows)
	if first != nil {
		fmt.Fprintf(w, "%d workers on connections of their own loop acquire → hold %s → release on N=%d for %s while one "+
			"caller arrives every %s and holds as long. With classes the broker hands a freed permit to the caller "+
			"first; the target is a caller's p99 wait of at most one hold plus one handoff, and the workers keeping "+
			"at least 90%% of their FIFO throughput. Redis has no classes: its row is FIFO. The target column adds "+
			"one hold to the p99 of a handoff to an idle waiter, measured twice: *alone*, by the same run's handoff "+
			"scenario (when it ran), and *under the run's load*, by a probe that times a handoff every %s between two callers of "+
			"a semaphore of its own on the same broker, on connections of their own, beside the workers and the caller "+
			"(in both runs, so that FIFO and classes bear the same load). For amqpsem it adds the p99 of a waiter "+
			"joining the token queue too (alone: RabbitMQ primitives, basic.consume until its consume-ok; under load: "+
			"the probe's waiter, from its Acquire call until the queue counts it), which a caller waits for before the "+
			"queue can serve it; a NATS pull needs no answer.\n\n",
			first.Workers, fmtDur(first.Hold), first.N, first.Duration, fmtDur(first.Every), fmtDur(first.Every))
	}
}

// priorityTarget is the caller's p99 target of a classes run: one hold
// plus one handoff's p99 (plus, on RabbitMQ, the p99 of joining the
// queue), and whether pr met it; "—" for a FIFO run. The handoff (and
// join) is measured twice: alone, by the same run's handoff scenario (and
// RabbitMQ primitives), when they ran; and beside the run, under its load
// (pr.Probe).
func priorityTarget(r *Report, s *SystemResult, pr *PriorityResult) string {
	if !pr.Classes || !s.Tokensem {
		return "—"
	}
	var parts []string
	verdict := func(target time.Duration) string {
		if pr.High.P99 > target {
			return fmt.Sprintf("missed by %.1f×", float64(pr.High.P99)/float64(target))
		}
		return "met"
	}
	if s.Handoff != nil {
		target := pr.Hold + s.Handoff.P99
		how := "hold + handoff"
		if s.Key == "amqpsem" && r.AMQPPrims != nil && r.AMQPPrims.Join.N > 0 {
			target += r.AMQPPrims.Join.P99
			how += " + join"
		}
		parts = append(parts, fmt.Sprintf("alone %s (%s): %s", fmtDur(target), how, verdict(target)))
	}
	if p := pr.Probe; p != nil && p.N > 0 {
		target := pr.Hold + p.P99
		how := "hold + handoff"
		if s.Key == "amqpsem" && p.Join.N > 0 {
			target += p.Join.P99
			how += " + join"
		}
		parts = append(parts, fmt.Sprintf("under the run's load %s (%s, %d probes): %s", fmtDur(target), how, p.N, verdict(target)))
	}
	if pr.ProbeFailed != "" {
		parts = append(parts, "under the run's load: the probe failed ("+pr.ProbeFailed+")")
	}
	if len(parts) == 0 {
		return "—"
	}
	return strings.Join(parts, "; ")
}

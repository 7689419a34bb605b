package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/adaptive"
	"github.com/tokensem/tokensem/amqpsem"
	"github.com/tokensem/tokensem/natssem"
	"github.com/tokensem/tokensem/reconciler"
)

// The adaptive scenario: a fleet of processes keeps its workers in front
// of a downstream of C servers (a FIFO queue served by C workers, each
// use taking the service time), each worker looping acquire → use →
// release and reporting the use's latency (queue wait and service) on its
// permit. C changes mid-run (12 → 6 → 16 by default). The same traffic
// runs in several modes: adaptive (an adaptive.Controller with Gradient
// moves the count from the fleet's reports, elected among two processes),
// right (the count set to C at each change: the fixed N that is right for
// each phase, the reference), and fixed counts (4, 12, 32 by default).

// adaptable is a tokensem semaphore as an adaptive controller drives it.
type adaptable interface {
	tokensem.Semaphore
	Resize(ctx context.Context, permits int) (reconciler.Report, error)
	PublishReport(ctx context.Context, r adaptive.Report) error
	SubscribeReports(ctx context.Context, out chan<- adaptive.Report) (stop func(), err error)
}

// observedOpener is a Client that opens a semaphore with an observer.
type observedOpener interface {
	OpenObserved(ctx context.Context, name string, o tokensem.Observer) (Sem, error)
}

func (c natsClient) OpenObserved(ctx context.Context, name string, o tokensem.Observer) (Sem, error) {
	s, err := natssem.Open(ctx, c.nc, name, append(groupOpts(c.group), natssem.WithObserver(o))...)
	if err != nil {
		return nil, err
	}
	return tokenSem{s: s}, nil
}

func (c amqpClient) OpenObserved(ctx context.Context, name string, o tokensem.Observer) (Sem, error) {
	s, err := amqpsem.Open(ctx, c.c, name, amqpsem.WithObserver(o))
	if err != nil {
		return nil, err
	}
	return tokenSem{s: s, onHold: func(p tokensem.Permit) { c.a.touch(name, p) }}, nil
}

// queueDownstream is C servers in front of a FIFO queue: a use waits for a
// free server, then takes the service time.
type queueDownstream struct {
	service time.Duration
	precise bool

	mu      sync.Mutex
	c, busy int
	queue   []chan struct{}
}

// setC changes the number of servers; a queued use starts at once on a
// server that the change frees.
func (d *queueDownstream) setC(c int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.c = c
	for d.busy < d.c && len(d.queue) > 0 {
		close(d.queue[0])
		d.queue = d.queue[1:]
		d.busy++
	}
}

// use waits for a server, serves, and returns how long both took.
func (d *queueDownstream) use() time.Duration {
	t0 := time.Now()
	d.mu.Lock()
	if d.busy < d.c {
		d.busy++
		d.mu.Unlock()
	} else {
		ch := make(chan struct{})
		d.queue = append(d.queue, ch)
		d.mu.Unlock()
		<-ch
	}
	holdFor(d.service, d.precise)
	d.mu.Lock()
	if d.busy <= d.c && len(d.queue) > 0 {
		close(d.queue[0]) // the server goes on to the next use
		d.queue = d.queue[1:]
	} else {
		d.busy--
	}
	d.mu.Unlock()
	return time.Since(t0)
}

// AdaptiveRun is one mode of the adaptive scenario.
type AdaptiveRun struct {
	Mode    string // "adaptive", "right" (N = C in each phase), "fixed"
	Fixed   int    // the count of a fixed run
	Workers int
	Service time.Duration
	Window  time.Duration
	Phases  []AdaptivePhase
	// Counts is the permit count over time (adaptive: each change the
	// controller made; right: each resize; fixed: the start).
	Counts    []CountPoint
	Decisions int // adaptive: decisions the controllers made
	Failed    int // adaptive: resizes that failed
	Peak      int // most workers holding at once
	MostSet   int // the largest count set in the run
	Errs      []string
}

// label names the run's mode in tables.
func (r *AdaptiveRun) label() string {
	switch r.Mode {
	case "fixed":
		return fmt.Sprintf("fixed %d", r.Fixed)
	case "right":
		return "N = C"
	}
	return "adaptive"
}

// CountPoint is the permit count from At (since the run's start) on.
type CountPoint struct {
	At time.Duration
	N  int
}

// AdaptivePhase is what the workers got while the downstream had C
// servers, over the whole phase and after its first settle time.
type AdaptivePhase struct {
	C                 int
	Start, Length     time.Duration
	Throughput        float64 // uses a second, whole phase
	SettledThroughput float64 // uses a second from Start+settle on
	Latency           Summary // of the uses, whole phase
	SettledLatency    Summary
	// Settled (adaptive) is when, after the phase began, the count came
	// within 20% of C and stayed there to the phase's end; -1: never.
	Settled time.Duration
}

// adaptiveSettle is the bound on how long the count may take to
// come within 20% of a new capacity; figures "settled" count from it.
const adaptiveSettle = 10 * time.Second

type useRecord struct {
	end     time.Duration // since the run's start
	latency time.Duration
}

// runAdaptive runs the traffic once in one mode: fixed > 0 holds that
// count; fixed == 0 and right resizes to each phase's C; otherwise a
// controller adapts, starting from start.
func runAdaptive(ctx context.Context, sys System, name string, caps []int, phase time.Duration, procs, workers, start, fixed int, right bool,
	service, window time.Duration, precise bool) (*AdaptiveRun, error) {
	run := &AdaptiveRun{Mode: "adaptive", Workers: workers, Service: service, Window: window}
	initial := start
	switch {
	case fixed > 0:
		run.Mode, run.Fixed, initial = "fixed", fixed, fixed
	case right:
		run.Mode, initial = "right", caps[0]
	}
	leaderName := name + "-lead"
	admin, err := sys.Connect(ctx)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	cleanup := func() {
		c := context.WithoutCancel(ctx)
		sys.Cleanup(c, name)
		sys.Cleanup(c, leaderName)
	}
	cleanup() // a run cut short before
	defer cleanup()
	adminSem, err := admin.Init(ctx, name, initial, workers)
	if err != nil {
		return nil, err
	}
	defer adminSem.Close()
	ad, ok := adminSem.(tokenSem).s.(adaptable)
	if !ok {
		return nil, errors.New("not an adaptable semaphore")
	}
	leadSem, err := admin.Init(ctx, leaderName, 1, 0)
	if err != nil {
		return nil, err
	}
	_ = leadSem.Close()

	var (
		mu      sync.Mutex
		counts  = []CountPoint{{0, initial}}
		records []useRecord
		errs    = map[string]int{}
	)
	t0 := time.Now() // times are taken from here, then counted from the first phase's start
	since := func() time.Duration { return time.Since(t0) }
	setCount := func(n int) {
		mu.Lock()
		defer mu.Unlock()
		if counts[len(counts)-1].N != n {
			counts = append(counts, CountPoint{since(), n})
		}
	}
	fail := func(what string, err error) {
		mu.Lock()
		defer mu.Unlock()
		errs[fmt.Sprintf("%s: %v", what, err)]++
	}

	down := &queueDownstream{service: service, precise: precise}
	down.setC(caps[0])
	var meter Meter
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	var decisions, failed atomic.Int64
	begin := make(chan struct{}) // the workers start with the first phase
	for p := range procs {
		cl, err := sys.Connect(ctx)
		if err != nil {
			return nil, err
		}
		defer cl.Close()
		oo, ok := cl.(observedOpener)
		if !ok {
			return nil, errors.New("the system opens no observed semaphore")
		}
		w := adaptive.NewWindow(name)
		sem, err := oo.OpenObserved(ctx, name, w)
		if err != nil {
			return nil, err
		}
		defer sem.Close()
		own := sem.(tokenSem).s.(adaptable)
		if run.Mode == "adaptive" {
			wg.Go(func() {
				if err := adaptive.Publish(wctx, w, fmt.Sprint("process-", p), window, own.PublishReport); err != nil && wctx.Err() == nil {
					fail("publish", err)
				}
			})
			if p < 2 { // two processes run a controller: one leads
				leader, err := cl.Open(ctx, leaderName)
				if err != nil {
					return nil, err
				}
				defer leader.Close()
				reports := make(chan adaptive.Report, 64)
				unsub, err := own.SubscribeReports(ctx, reports)
				if err != nil {
					return nil, err
				}
				defer unsub()
				c := &adaptive.Controller{
					Leader: leader.(tokenSem).s,
					Resize: func(ctx context.Context, n int) error { _, err := own.Resize(ctx, n); return err },
					Permits: func(ctx context.Context) (int, error) {
						st, err := own.Status(ctx)
						return st.Permits, err
					},
					Reports:   reports,
					Algorithm: &adaptive.Gradient{},
					Bounds:    adaptive.Bounds{Min: 1, Max: 64},
					Window:    window,
					Decided: func(d adaptive.Decision) {
						decisions.Add(1)
						if d.Err != nil {
							failed.Add(1)
							fail("resize", d.Err)
						}
						setCount(d.Permits)
					},
				}
				wg.Go(func() {
					if err := c.Run(wctx); err != nil && wctx.Err() == nil {
						fail("controller", err)
					}
				})
			}
		}
		for range workers / procs {
			wg.Go(func() {
				select {
				case <-begin:
				case <-wctx.Done():
					return
				}
				for wctx.Err() == nil {
					h, err := sem.Acquire(wctx)
					if err != nil {
						if wctx.Err() == nil {
							fail("acquire", err)
							time.Sleep(10 * time.Millisecond)
						}
						continue
					}
					meter.Enter()
					lat := down.use()
					meter.Leave()
					if p, ok := h.(tokensem.Permit); ok {
						tokensem.ReportUse(p, lat, false)
					}
					rctx, cancel := context.WithTimeout(context.WithoutCancel(wctx), tokensem.ReleaseTimeout)
					if err := h.Release(rctx); err != nil {
						fail("release", err)
					}
					cancel()
					at := since()
					mu.Lock()
					records = append(records, useRecord{at, lat})
					mu.Unlock()
				}
			})
		}
	}

	// The phases.
	first := since()
	close(begin)
	for i, c := range caps {
		start := since()
		if i > 0 {
			down.setC(c)
			if run.Mode == "right" {
				if _, err := ad.Resize(ctx, c); err != nil {
					fail("resize", err)
				} else {
					setCount(c)
				}
			}
		}
		run.Phases = append(run.Phases, AdaptivePhase{C: c, Start: start})
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(first + time.Duration(i+1)*phase - since()):
		}
	}
	end := since()
	stop()
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	run.Counts = counts
	run.Peak = meter.Peak()
	run.Decisions, run.Failed = int(decisions.Load()), int(failed.Load())
	// Count from the first phase's start.
	for i := range counts {
		counts[i].At = max(0, counts[i].At-first)
		run.MostSet = max(run.MostSet, counts[i].N)
	}
	for i := range records {
		records[i].end -= first
	}
	for i := range run.Phases {
		run.Phases[i].Start -= first
	}
	end -= first
	for e, n := range errs {
		run.Errs = append(run.Errs, fmt.Sprintf("%d× %s", n, e))
	}
	slices.Sort(run.Errs)
	for i := range run.Phases {
		ph := &run.Phases[i]
		to := end
		if i+1 < len(run.Phases) {
			to = run.Phases[i+1].Start
		}
		ph.Length = to - ph.Start
		var all, settled []time.Duration
		for _, r := range records {
			if r.end >= ph.Start && r.end < to {
				all = append(all, r.latency)
				if r.end >= ph.Start+adaptiveSettle {
					settled = append(settled, r.latency)
				}
			}
		}
		ph.Latency, ph.SettledLatency = Summarize(all), Summarize(settled)
		ph.Throughput = float64(len(all)) / ph.Length.Seconds()
		if s := ph.Length - adaptiveSettle; s > 0 {
			ph.SettledThroughput = float64(len(settled)) / s.Seconds()
		}
		ph.Settled = settledAt(counts, ph.C, ph.Start, to)
	}
	return run, nil
}

// settledAt returns how long after from the count came within 20% of c
// and stayed there until to; -1 if it was not there at to.
func settledAt(counts []CountPoint, c int, from, to time.Duration) time.Duration {
	in := func(n int) bool { return float64(n) >= 0.8*float64(c) && float64(n) <= 1.2*float64(c) }
	since := time.Duration(-1)
	for i, cp := range counts {
		if cp.At >= to {
			break
		}
		at := max(cp.At, from)
		if i+1 < len(counts) && counts[i+1].At <= from {
			continue // superseded before the phase
		}
		switch {
		case in(cp.N) && since < 0:
			since = at - from
		case !in(cp.N):
			since = -1
		}
	}
	return since
}

package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// CycleResult: one client's uncontended Acquire+Release.
type CycleResult struct {
	Summary
	CPU CPUUse
}

// runCycle measures samples acquire+release cycles of one client on a
// semaphore of one permit (a tenth more run first, as a warm-up).
func runCycle(ctx context.Context, sys System, name string, samples int) (*CycleResult, error) {
	cl, err := sys.Connect(ctx)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	defer sys.Cleanup(context.WithoutCancel(ctx), name)
	s, err := cl.Init(ctx, name, 1, 0)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	d := make([]time.Duration, 0, samples)
	cpu := startCPU()
	for i := range samples + samples/10 {
		t0 := time.Now()
		h, err := s.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		if err := h.Release(ctx); err != nil {
			return nil, err
		}
		if i >= samples/10 {
			d = append(d, time.Since(t0))
		}
	}
	return &CycleResult{Summary: Summarize(d), CPU: cpu.Stop()}, nil
}

// ContentionResult: workers loop acquire, hold, release on N permits.
type ContentionResult struct {
	Workers, N   int
	Hold         time.Duration // nominal hold
	MeanHold     time.Duration // measured (time.Sleep overshoots)
	Duration     time.Duration
	Acquisitions int
	Throughput   float64 // acquisitions per second
	Ceiling      float64 // N / nominal hold
	Wait         Summary
	Release      Summary // time in Release
	// Gap is the time a slot stood idle between holders: from the start of
	// a holder's Release to the next holder of the same slot returning from
	// Acquire (tokensem only: a Redis permit has no slot identity). With
	// every worker busy, throughput ≈ N / (mean hold + mean gap).
	Gap  Summary
	Fair Fairness
	Peak int // most holders at once (Meter)
	CPU  CPUUse
}

// Percent is the throughput as a share of the ceiling.
func (c *ContentionResult) Percent() float64 { return 100 * c.Throughput / c.Ceiling }

// openWorkers creates semaphore name with n permits and opens it once per
// worker, each on a connection of its own, warming every client up with one
// warm(i, sem) and its release. done closes everything and removes the
// semaphore; it is nil when err is not.
func openWorkers(ctx context.Context, sys System, name string, workers, n int, warm func(int, Sem) (Held, error)) (sems []Sem, done func(), err error) {
	var closers []func()
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	defer func() {
		// The return statement has set done already (nil on an error).
		if err != nil {
			closeAll()
		}
	}()
	cl, err := sys.Connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	closers = append(closers, func() { _ = cl.Close() }, func() { sys.Cleanup(context.WithoutCancel(ctx), name) })
	s0, err := cl.Init(ctx, name, n, workers)
	if err != nil {
		return nil, nil, err
	}
	closers = append(closers, func() { _ = s0.Close() })
	sems = make([]Sem, workers)
	for i := range sems {
		c, err := sys.Connect(ctx)
		if err != nil {
			return nil, nil, err
		}
		closers = append(closers, func() { _ = c.Close() })
		if sems[i], err = c.Open(ctx, name); err != nil {
			return nil, nil, err
		}
		closers = append(closers, func() { _ = sems[i].Close() })
		h, err := warm(i, sems[i])
		if err != nil {
			return nil, nil, err
		}
		if err := h.Release(ctx); err != nil {
			return nil, nil, err
		}
	}
	return sems, closeAll, nil
}

// runContention runs workers, each on a connection of its own, against one
// semaphore of n permits for dur: acquire (timed as the wait), hold for
// hold, release, repeat. Only acquisitions that began inside the window
// count; the workers finish the cycle they are in when it closes.
func runContention(ctx context.Context, sys System, name string, workers, n int, hold, dur time.Duration, precise bool) (*ContentionResult, error) {
	sems, done, err := openWorkers(ctx, sys, name, workers, n, func(_ int, s Sem) (Held, error) { return s.Acquire(ctx) })
	if err != nil {
		return nil, err
	}
	defer done()

	var m Meter
	counts := make([]int, workers)
	waits := make([][]time.Duration, workers)
	holds := make([]time.Duration, workers)
	rels := make([][]time.Duration, workers)
	gaps := make([][]time.Duration, workers)
	lastRelease := make([]atomic.Int64, n) // per slot: unix ns of the latest Release call
	errs := make([]error, workers)
	cpu := startCPU()
	start := time.Now()
	deadline := start.Add(dur)
	wctx, cancel := context.WithDeadline(ctx, deadline.Add(30*time.Second))
	defer cancel()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for {
				t0 := time.Now()
				if !t0.Before(deadline) {
					return
				}
				h, err := sems[w].Acquire(wctx)
				if err != nil {
					errs[w] = err
					return
				}
				got := time.Now()
				m.Enter()
				slot := slotOf(h)
				var gap time.Duration
				if slot >= 0 && slot < n {
					if t := lastRelease[slot].Load(); t != 0 {
						gap = got.Sub(time.Unix(0, t))
					}
				}
				holdFor(hold, precise)
				held := time.Since(got)
				m.Leave()
				tr := time.Now()
				if slot >= 0 && slot < n {
					lastRelease[slot].Store(tr.UnixNano())
				}
				if err := h.Release(wctx); err != nil {
					errs[w] = err
					return
				}
				if got.Before(deadline) {
					rels[w] = append(rels[w], time.Since(tr))
					if gap > 0 {
						gaps[w] = append(gaps[w], gap)
					}
					counts[w]++
					waits[w] = append(waits[w], got.Sub(t0))
					holds[w] += held
				}
			}
		})
	}
	wg.Wait()
	use := cpu.Stop()
	if err := joinDistinct(errs); err != nil {
		return nil, err
	}
	r := &ContentionResult{Workers: workers, N: n, Hold: hold, Duration: dur, Peak: m.Peak(),
		Ceiling: float64(n) / hold.Seconds(), Fair: FairnessOf(counts), CPU: use}
	var all, allRel, allGap []time.Duration
	var holdSum time.Duration
	for w := range workers {
		r.Acquisitions += counts[w]
		all = append(all, waits[w]...)
		allRel = append(allRel, rels[w]...)
		allGap = append(allGap, gaps[w]...)
		holdSum += holds[w]
	}
	r.Throughput = float64(r.Acquisitions) / dur.Seconds()
	r.Wait = Summarize(all)
	r.Release = Summarize(allRel)
	r.Gap = Summarize(allGap)
	if r.Acquisitions > 0 {
		r.MeanHold = holdSum / time.Duration(r.Acquisitions)
	}
	return r, nil
}

// joinDistinct joins errors, each distinct message once with how many
// workers hit it.
func joinDistinct(errs []error) error {
	count := map[string]int{}
	var order []string
	for _, err := range errs {
		if err == nil {
			continue
		}
		if count[err.Error()] == 0 {
			order = append(order, err.Error())
		}
		count[err.Error()]++
	}
	if len(order) == 0 {
		return nil
	}
	var joined []error
	for _, msg := range order {
		if n := count[msg]; n > 1 {
			msg = fmt.Sprintf("%s (%d workers)", msg, n)
		}
		joined = append(joined, errors.New(msg))
	}
	return errors.Join(joined...)
}

// HandoffResult: release → a blocked waiter on another connection holds.
type HandoffResult struct {
	Summary
	Samples []time.Duration
	// Join is the waiter's Acquire call until the broker counts it
	// waiting (sys.Waiting, read every 100 µs: an upper bound).
	Join Summary
	CPU  CPUUse
}

// runHandoff measures, samples times, the time from a holder's Release
// call to a waiter on another connection returning from Acquire. The waiter
// is first seen waiting (sys.Waiting); the release comes 1 ms later (the
// waiter has gone idle, as a waiter usually has) plus, for a polling
// system, a random part of its retry sleep (settleMax is its longest
// sleep), so the samples cover the whole retry cycle.
func runHandoff(ctx context.Context, sys System, name string, samples int, idle, settleMax time.Duration) (*HandoffResult, error) {
	return handoffs(ctx, sys, name, samples, max(samples/20, 2), time.Time{}, 0, idle, settleMax)
}

// handoffProbe is runHandoff beside other work, until the time given: the
// handoff to an idle waiter under that work's load. It starts a handoff
// every pace at most, so that it adds little load of its own.
func handoffProbe(ctx context.Context, sys System, name string, until time.Time, pace, idle time.Duration) (*HandoffResult, error) {
	return handoffs(ctx, sys, name, math.MaxInt32, 5, until, pace, idle, 0)
}

// handoffs is runHandoff with warm handoffs first, not timed, one started
// every pace at most (0: one after the other), ending early at until when
// it is set.
func handoffs(ctx context.Context, sys System, name string, samples, warm int, until time.Time, pace, idle, settleMax time.Duration) (*HandoffResult, error) {
	c1, err := sys.Connect(ctx)
	if err != nil {
		return nil, err
	}
	defer c1.Close()
	defer sys.Cleanup(context.WithoutCancel(ctx), name)
	holder, err := c1.Init(ctx, name, 1, 0)
	if err != nil {
		return nil, err
	}
	defer holder.Close()
	c2, err := sys.Connect(ctx)
	if err != nil {
		return nil, err
	}
	defer c2.Close()
	waiter, err := c2.Open(ctx, name)
	if err != nil {
		return nil, err
	}
	defer waiter.Close()
	type got struct {
		h   Held
		at  time.Time
		err error
	}
	var d, joins []time.Duration
	cpu := startCPU()
	next := time.Now()
	for i := range samples + warm {
		if pace > 0 {
			time.Sleep(time.Until(next))
			next = time.Now().Add(pace)
		}
		if !until.IsZero() && time.Now().After(until) {
			break
		}
		h, err := holder.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		base, err := settledWaiting(ctx, sys, name)
		if err != nil {
			return nil, err
		}
		ch := make(chan got, 1)
		called := time.Now()
		go func() {
			w, err := waiter.Acquire(ctx)
			ch <- got{w, time.Now(), err}
		}()
		for deadline := time.Now().Add(10 * time.Second); ; {
			n, err := sys.Waiting(ctx, name)
			if err == nil && n > base {
				if i >= warm {
					joins = append(joins, time.Since(called))
				}
				break
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("handoff: the waiter never showed as waiting (last error %v)", err)
			}
			time.Sleep(100 * time.Microsecond)
		}
		settle := idle // the waiter is parked, as a waiter usually is
		if settleMax > 0 {
			settle += rand.N(settleMax)
		}
		time.Sleep(settle)
		t0 := time.Now()
		if err := h.Release(ctx); err != nil {
			return nil, err
		}
		g := <-ch
		if g.err != nil {
			return nil, g.err
		}
		if i >= warm { // the first few warm up
			d = append(d, g.at.Sub(t0))
		}
		if err := g.h.Release(ctx); err != nil {
			return nil, err
		}
	}
	return &HandoffResult{Summary: Summarize(d), Samples: d, Join: Summarize(joins), CPU: cpu.Stop()}, nil
}

// laggingCount is a System whose waiting count trails the broker's own
// state (settledWaiting).
type laggingCount interface{ WaitingLags() bool }

// settledWaiting returns what the broker counts as waiting before a new
// waiter comes: a RabbitMQ quorum queue also counts the holder of an
// unacked token as a consumer, and its count lags a release by about
// 1.5 ms (the requeue's Raft commit), so there the count is read until it
// holds still for three reads in a row, 0.5 ms apart. Other systems' counts
// are exact at once and are read once: a millisecond of quiet before every
// handoff would park the holder's and the broker's threads, and the handoff
// to a running waiter would time a cold release (it did until 2026-11-25:
// 2.1x the same loop without it, for plain nats.go as for natssem).
func settledWaiting(ctx context.Context, sys System, name string) (int, error) {
	if l, ok := sys.(laggingCount); !ok || !l.WaitingLags() {
		return sys.Waiting(ctx, name)
	}
	last, same := -1, 0
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
		n, err := sys.Waiting(ctx, name)
		if err != nil {
			return 0, err
		}
		if n == last {
			same++
			if same == 2 {
				return n, nil
			}
		} else {
			last, same = n, 0
		}
		time.Sleep(500 * time.Microsecond)
	}
	return last, nil
}

// SemsResult: many semaphores on one broker.
type SemsResult struct {
	Count     int
	Clients   int
	InitTotal time.Duration // wall time to create them all
	Init      Summary       // one Init
	First     Summary       // the first acquire+release on each, all of them open
	Cycle     Summary       // the second acquire+release on each
	// Server is what the semaphores cost a server running in the
	// harness's process (nil for a server of its own process).
	Server *ServerCost
}

// ServerCost is what count semaphores cost a server in the harness's
// process: measured with every semaphore still on the server but every
// client's handle closed, against before the first was made.
type ServerCost struct {
	HeapPerSem  float64 // bytes: runtime.MemStats.HeapAlloc after two GCs
	StackPerSem float64 // bytes: StackInuse (the server's goroutines)
	Goroutines  int     // more than before
	FDs         int     // open file descriptors more than before (-1: unknown)
}

// inProcess is a System whose servers run in the harness's process, so
// that their memory shows in its heap.
type inProcess interface{ InProcess() bool }

// processState is the heap, stacks, goroutines and open files of this
// process, after two GCs.
func processState() (runtime.MemStats, int, int) {
	m := settledMem()
	fds := -1
	if ents, err := os.ReadDir("/proc/self/fd"); err == nil {
		fds = len(ents)
	}
	return m, runtime.NumGoroutine(), fds
}

// settledMem is the process's memory statistics after two GCs.
func settledMem() runtime.MemStats {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m
}

// settleGoroutines waits, at most limit, until the number of goroutines
// stops falling for 100 ms.
func settleGoroutines(limit time.Duration) {
	deadline := time.Now().Add(limit)
	last := runtime.NumGoroutine()
	for time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		n := runtime.NumGoroutine()
		if n >= last {
			return
		}
		last = n
	}
}

// serverCost is the growth from before to now, per semaphore.
func serverCost(count int, before runtime.MemStats, goBefore, fdBefore int) *ServerCost {
	after, goAfter, fdAfter := processState()
	c := &ServerCost{
		HeapPerSem:  (float64(after.HeapAlloc) - float64(before.HeapAlloc)) / float64(count),
		StackPerSem: (float64(after.StackInuse) - float64(before.StackInuse)) / float64(count),
		Goroutines:  goAfter - goBefore, FDs: -1,
	}
	if fdBefore >= 0 && fdAfter >= 0 {
		c.FDs = fdAfter - fdBefore
	}
	return c
}

// runManySems creates count semaphores of n permits (conc at a time) on as
// few connections as the system allows, then runs two acquire+release
// cycles on each while all are open (the first sets up the client's state
// for that semaphore), then removes them.
func runManySems(ctx context.Context, sys System, prefix string, count, n, conc int) (*SemsResult, error) {
	per := sys.WaitersPerClient()
	if per <= 0 {
		per = count
	}
	nClients := (count + per - 1) / per
	clients := make([]Client, nClients)
	for i := range clients {
		c, err := sys.Connect(ctx)
		if err != nil {
			return nil, err
		}
		defer c.Close()
		clients[i] = c
	}
	names := make([]string, count)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%04d", prefix, i)
	}
	defer func() {
		cctx := context.WithoutCancel(ctx)
		parallel(conc, count, func(i int) error { sys.Cleanup(cctx, names[i]); return nil })
	}()
	measure := false
	if ip, ok := sys.(inProcess); ok {
		measure = ip.InProcess()
	}
	var memBefore runtime.MemStats
	var goBefore, fdBefore int
	if measure {
		memBefore, goBefore, fdBefore = processState()
	}
	sems := make([]Sem, count)
	inits := make([]time.Duration, count)
	t0 := time.Now()
	err := parallel(conc, count, func(i int) error {
		t := time.Now()
		s, err := clients[i/per].Init(ctx, names[i], n, 0)
		if err != nil {
			return fmt.Errorf("init %s: %w", names[i], err)
		}
		inits[i] = time.Since(t)
		sems[i] = s
		return nil
	})
	initTotal := time.Since(t0)
	defer func() {
		for _, s := range sems {
			if s != nil {
				_ = s.Close()
			}
		}
	}()
	if err != nil {
		return nil, err
	}
	var rounds [2][]time.Duration
	for round := range rounds {
		for i, s := range sems {
			t := time.Now()
			h, err := s.Acquire(ctx)
			if err != nil {
				return nil, fmt.Errorf("acquire %s: %w", names[i], err)
			}
			if err := h.Release(ctx); err != nil {
				return nil, err
			}
			rounds[round] = append(rounds[round], time.Since(t))
		}
	}
	r := &SemsResult{Count: count, Clients: nClients, InitTotal: initTotal, Init: Summarize(inits),
		First: Summarize(rounds[0]), Cycle: Summarize(rounds[1])}
	if measure {
		for i, s := range sems {
			_ = s.Close()
			sems[i] = nil
		}
		settleGoroutines(2 * time.Second) // closed handles drain their inboxes
		r.Server = serverCost(count, memBefore, goBefore, fdBefore)
	}
	return r, nil
}

// parallel runs fn(0..count-1) on conc goroutines and returns the errors.
func parallel(conc, count int, fn func(i int) error) error {
	var next atomic.Int64
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for range min(conc, count) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= count {
					return
				}
				if err := fn(i); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					next.Store(int64(count)) // stop handing out work
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// WaitersResult: thousands of callers blocked on one semaphore.
type WaitersResult struct {
	Waiters, N, Clients int
	Hold                time.Duration
	QueuedIn            time.Duration // until the server counted them all waiting
	Served              int
	ServedIn            time.Duration // first release → last waiter done
	Ideal               time.Duration // ceil(W/N) × hold
	Peak                int
	HeapPerWaiter       float64 // bytes of heap per blocked caller
	StackPerWaiter      float64 // bytes of goroutine stack per blocked caller
	Complete            bool
}

// runWaiters holds all n permits, starts waiters callers blocked in
// Acquire (spread over as few connections as the system allows), measures
// the client memory they take once the server counts them all waiting,
// then releases the permits and times until every waiter has acquired,
// held for hold and released. serveLimit bounds that last phase.
func runWaiters(ctx context.Context, sys System, name string, waiters, n int, hold, serveLimit time.Duration, precise bool) (*WaitersResult, error) {
	c0, err := sys.Connect(ctx)
	if err != nil {
		return nil, err
	}
	defer c0.Close()
	defer sys.Cleanup(context.WithoutCancel(ctx), name)
	s0, err := c0.Init(ctx, name, n, waiters+n+64)
	if err != nil {
		return nil, err
	}
	defer s0.Close()
	held := make([]Held, n)
	for i := range held {
		if held[i], err = s0.Acquire(ctx); err != nil {
			return nil, err
		}
	}
	per := sys.WaitersPerClient()
	if per <= 0 {
		per = waiters
	}
	sems := make([]Sem, (waiters+per-1)/per)
	for i := range sems {
		c, err := sys.Connect(ctx)
		if err != nil {
			return nil, err
		}
		defer c.Close()
		if sems[i], err = c.Open(ctx, name); err != nil {
			return nil, err
		}
		defer sems[i].Close()
	}
	r := &WaitersResult{Waiters: waiters, N: n, Clients: len(sems), Hold: hold,
		Ideal: time.Duration((waiters+n-1)/n) * hold}

	base, err := settledWaiting(ctx, sys, name)
	if err != nil {
		return nil, err
	}
	before := settledMem()

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var m Meter
	var served atomic.Int64
	var lastDone atomic.Int64 // unix ns
	var errMu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := range waiters {
		s := sems[i/per]
		wg.Go(func() {
			h, err := s.Acquire(wctx)
			if err != nil {
				if wctx.Err() == nil {
					errMu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					errMu.Unlock()
				}
				return
			}
			m.Enter()
			holdFor(hold, precise)
			m.Leave()
			if err := h.Release(context.WithoutCancel(wctx)); err != nil {
				errMu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				errMu.Unlock()
			}
			served.Add(1)
			lastDone.Store(time.Now().UnixNano())
		})
	}
	stop := func(err error) (*WaitersResult, error) {
		cancel()
		wg.Wait()
		for _, h := range held {
			if h != nil {
				_ = h.Release(context.WithoutCancel(ctx))
			}
		}
		return r, err
	}
	queuedLimit := 2*time.Minute + time.Duration(waiters)*10*time.Millisecond
	for {
		k, err := sys.Waiting(ctx, name)
		if err == nil && k-base >= waiters {
			break
		}
		errMu.Lock()
		ferr := firstErr
		errMu.Unlock()
		if ferr != nil {
			return stop(fmt.Errorf("a waiter failed: %w", ferr))
		}
		if time.Since(t0) > queuedLimit {
			return stop(fmt.Errorf("only %d of %d waiters counted waiting after %v (last error %v)", k-base, waiters, queuedLimit, err))
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.QueuedIn = time.Since(t0)
	after := settledMem()
	r.HeapPerWaiter = (float64(after.HeapAlloc) - float64(before.HeapAlloc)) / float64(waiters)
	r.StackPerWaiter = (float64(after.StackInuse) - float64(before.StackInuse)) / float64(waiters)

	t1 := time.Now()
	for i, h := range held {
		if err := h.Release(ctx); err != nil {
			return stop(err)
		}
		held[i] = nil
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(serveLimit):
	}
	r.Served = int(served.Load())
	r.Peak = m.Peak()
	if l := lastDone.Load(); l > 0 {
		r.ServedIn = time.Unix(0, l).Sub(t1)
	}
	r.Complete = r.Served == waiters
	errMu.Lock()
	ferr := firstErr
	errMu.Unlock()
	if !r.Complete {
		r.ServedIn = time.Since(t1)
		return stop(fmt.Errorf("served %d of %d waiters in %v", r.Served, waiters, serveLimit))
	}
	return stop(ferr)
}

// BigNResult: one semaphore of many permits.
type BigNResult struct {
	N           int
	Init        time.Duration
	First       time.Duration // the first acquire+release
	Cycle       Summary       // the next ten
	Status      Summary       // census of all N tokens
	Census      Census
	AfterCensus time.Duration // an acquire+release right after the last census
}

// runBigN creates a semaphore of n permits, runs acquire+release cycles
// (the first apart, then ten more), takes statuses censuses, and runs one
// more cycle right after them.
func runBigN(ctx context.Context, sys System, name string, n, statuses int) (*BigNResult, error) {
	cl, err := sys.Connect(ctx)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	defer sys.Cleanup(context.WithoutCancel(ctx), name)
	r := &BigNResult{N: n}
	t0 := time.Now()
	s, err := cl.Init(ctx, name, n, 0)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	r.Init = time.Since(t0)
	cycle := func() (time.Duration, error) {
		t := time.Now()
		h, err := s.Acquire(ctx)
		if err != nil {
			return 0, err
		}
		if err := h.Release(ctx); err != nil {
			return 0, err
		}
		return time.Since(t), nil
	}
	if r.First, err = cycle(); err != nil {
		return r, err
	}
	var cycles []time.Duration
	for range 10 {
		d, err := cycle()
		if err != nil {
			return r, err
		}
		cycles = append(cycles, d)
	}
	r.Cycle = Summarize(cycles)
	var st []time.Duration
	for range statuses {
		t := time.Now()
		if r.Census, err = s.Status(ctx); err != nil {
			return r, err
		}
		st = append(st, time.Since(t))
	}
	r.Status = Summarize(st)
	if r.AfterCensus, err = cycle(); err != nil {
		return r, err
	}
	if statuses > 0 && (r.Census.Permits != n || !r.Census.Healthy) {
		return r, fmt.Errorf("census of %d permits: %+v", n, r.Census)
	}
	return r, nil
}

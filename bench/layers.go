package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/amqpsem"
	"github.com/tokensem/tokensem/internal/faultproxy"
)

// The layers scenario: a regional semaphore on the local broker under a
// global one reached through a delaying proxy (a distant broker, the
// project's fault proxy). One caller times its acquire three ways: the
// regional semaphore alone, the exact mode (AcquireAll of global and
// regional) and the block mode (AcquireAll of a tokensem.Block of global,
// and regional, once warm). Then two regions contend for the global
// limit: each has a Block of its own (a process of its own, as far as the
// brokers can tell) and a different number of workers looping AcquireAll →
// hold → release; each region's share of the holds is set beside its
// share of the workers, and an atomic meter across both checks the global
// limit.

// distant is a System whose clients can reach its broker through another
// address: a proxy in front of it.
type distant interface {
	// BrokerAddr is the broker's host:port.
	BrokerAddr() (string, error)
	// ConnectVia is Connect through addr.
	ConnectVia(ctx context.Context, addr string) (Client, error)
}

func (n *natsSystem) BrokerAddr() (string, error) {
	if n.cluster != nil || strings.Contains(n.url, ",") {
		return "", errors.New("the layers scenario needs a single NATS server")
	}
	u, err := url.Parse(n.url)
	if err != nil {
		return "", err
	}
	return u.Host, nil
}

func (n *natsSystem) ConnectVia(_ context.Context, addr string) (Client, error) {
	nc, err := nats.Connect("nats://"+addr, nats.Name("bench-distant"))
	if err != nil {
		return nil, err
	}
	return natsClient{nc: nc, group: n.group, replicas: n.replicas}, nil
}

func (a *amqpSystem) BrokerAddr() (string, error) {
	u, err := url.Parse(a.url)
	if err != nil {
		return "", err
	}
	if u.Port() == "" {
		return net.JoinHostPort(u.Hostname(), "5672"), nil
	}
	return u.Host, nil
}

func (a *amqpSystem) ConnectVia(ctx context.Context, addr string) (Client, error) {
	u, err := url.Parse(a.url)
	if err != nil {
		return nil, err
	}
	u.Host = addr
	c, err := amqpsem.Dial(ctx, u.String())
	if err != nil {
		return nil, err
	}
	return amqpClient{a: a, c: c}, nil
}

// LayersResult is one run of the layers scenario.
type LayersResult struct {
	RTT                 time.Duration // round trip the proxy adds to the global broker
	Plain, Exact, Block Summary       // one caller's acquire: regional alone, exact mode, block mode (warm)
	// The same callers' acquire + release: a release that returns before
	// the broker has its token back moves time into the next acquire.
	PlainCycle, ExactCycle, BlockCycle Summary
	Global                             int // the global limit of the contention phase
	Hold, Duration                     time.Duration
	Regions                            []LayerRegion
	Peak                               int // most holders at once across both regions (atomic meter)
}

// LayerRegion is what one region's workers got in the contention phase.
type LayerRegion struct {
	Workers, Holds int
	Wait           Summary
}

// Share returns the region's share of the holds and of the workers.
func (r *LayersResult) Share(i int) (holds, workers float64) {
	var h, w int
	for _, g := range r.Regions {
		h += g.Holds
		w += g.Workers
	}
	if h == 0 || w == 0 {
		return 0, 0
	}
	return float64(r.Regions[i].Holds) / float64(h), float64(r.Regions[i].Workers) / float64(w)
}

// semOf returns the tokensem.Semaphore behind a Sem of a tokensem system.
func semOf(s Sem) (tokenSem, error) {
	t, ok := s.(tokenSem)
	if !ok {
		return tokenSem{}, fmt.Errorf("%T is not a tokensem semaphore", s)
	}
	return t, nil
}

func runLayers(ctx context.Context, sys System, name string, rtt time.Duration, samples, global int, workers [2]int,
	hold, dur time.Duration, precise bool) (res *LayersResult, err error) {
	d, ok := sys.(distant)
	if !ok {
		return nil, fmt.Errorf("%s cannot be reached through a proxy", sys.Label())
	}
	target, err := d.BrokerAddr()
	if err != nil {
		return nil, err
	}
	px, err := faultproxy.NewDelayed(target, rtt/2)
	if err != nil {
		return nil, err
	}
	defer px.Close()

	var closers []func()
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}()
	local := func() (Client, error) {
		c, err := sys.Connect(ctx)
		if err == nil {
			closers = append(closers, func() { _ = c.Close() })
		}
		return c, err
	}
	far := func() (Client, error) {
		c, err := d.ConnectVia(ctx, px.Addr())
		if err == nil {
			closers = append(closers, func() { _ = c.Close() })
		}
		return c, err
	}
	gName, regions := name+"-global", [2]string{name + "-eu", name + "-us"}
	admin, err := local()
	if err != nil {
		return nil, err
	}
	for _, n := range []string{gName, regions[0], regions[1]} {
		// Regions have room for every worker: only the global limit binds.
		permits := workers[0] + workers[1]
		if n == gName {
			permits = global
		}
		s, err := admin.Init(ctx, n, permits, permits+8)
		if err != nil {
			return nil, err
		}
		closers = append(closers, func() { _ = s.Close(); sys.Cleanup(context.WithoutCancel(ctx), n) })
	}
	open := func(c Client, n string) (tokenSem, error) {
		s, err := c.Open(ctx, n)
		if err != nil {
			return tokenSem{}, err
		}
		closers = append(closers, func() { _ = s.Close() })
		return semOf(s)
	}
	res = &LayersResult{RTT: rtt, Global: global, Hold: hold, Duration: dur}

	// One caller, three ways.
	lc, err := local()
	if err != nil {
		return nil, err
	}
	fc, err := far()
	if err != nil {
		return nil, err
	}
	eu, err := open(lc, regions[0])
	if err != nil {
		return nil, err
	}
	g, err := open(fc, gName)
	if err != nil {
		return nil, err
	}
	block, err := tokensem.NewBlock(g.s, tokensem.WithBlockIdle(time.Second))
	if err != nil {
		return nil, err
	}
	defer block.Close()
	timeIt := func(acquire func() (Held, error)) (acq, cycle Summary, err error) {
		var as, cs []time.Duration
		for i := range samples + samples/10 {
			t0 := time.Now()
			h, err := acquire()
			if err != nil {
				return Summary{}, Summary{}, err
			}
			t1 := time.Now()
			if err := h.Release(ctx); err != nil {
				return Summary{}, Summary{}, err
			}
			if i >= samples/10 {
				as, cs = append(as, t1.Sub(t0)), append(cs, time.Since(t0))
			}
		}
		return Summarize(as), Summarize(cs), nil
	}
	all := func(sems ...tokensem.Semaphore) func() (Held, error) {
		return func() (Held, error) {
			set, err := tokensem.AcquireAll(ctx, sems...)
			if err != nil {
				return nil, err
			}
			for _, p := range set.Permits() {
				for _, t := range []tokenSem{eu, g} {
					if t.onHold != nil && p.Token().Semaphore == t.s.(interface{ Name() string }).Name() {
						t.onHold(p)
					}
				}
			}
			return set, nil
		}
	}
	if res.Plain, res.PlainCycle, err = timeIt(func() (Held, error) { return eu.Acquire(ctx) }); err != nil {
		return nil, fmt.Errorf("regional alone: %w", err)
	}
	if res.Exact, res.ExactCycle, err = timeIt(all(g.s, eu.s)); err != nil {
		return nil, fmt.Errorf("exact mode: %w", err)
	}
	if res.Block, res.BlockCycle, err = timeIt(all(block, eu.s)); err != nil {
		return nil, fmt.Errorf("block mode: %w", err)
	}

	// Two regions contend.
	var m Meter
	res.Regions = make([]LayerRegion, 2)
	waits := make([][]time.Duration, 2)
	var wmu sync.Mutex
	var failed atomic.Value
	deadline := time.Now().Add(dur)
	var wg sync.WaitGroup
	for r := range 2 {
		rc, err := far()
		if err != nil {
			return nil, err
		}
		rg, err := open(rc, gName)
		if err != nil {
			return nil, err
		}
		b, err := tokensem.NewBlock(rg.s)
		if err != nil {
			return nil, err
		}
		defer b.Close()
		res.Regions[r].Workers = workers[r]
		for range workers[r] {
			wc, err := local()
			if err != nil {
				return nil, err
			}
			reg, err := open(wc, regions[r])
			if err != nil {
				return nil, err
			}
			wg.Go(func() {
				var mine []time.Duration
				defer func() {
					wmu.Lock()
					waits[r] = append(waits[r], mine...)
					res.Regions[r].Holds += len(mine)
					wmu.Unlock()
				}()
				for time.Now().Before(deadline) {
					t0 := time.Now()
					set, err := tokensem.AcquireAll(ctx, b, reg.s)
					if err != nil {
						failed.CompareAndSwap(nil, err)
						return
					}
					if reg.onHold != nil { // amqpsem: the slots Cleanup removes
						reg.onHold(set.Permits()[1])
						rg.onHold(set.Permits()[0])
					}
					mine = append(mine, time.Since(t0))
					m.Enter()
					holdFor(hold, precise)
					m.Leave()
					if err := set.Release(ctx); err != nil {
						failed.CompareAndSwap(nil, err)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		return nil, fmt.Errorf("contention: %w", err)
	}
	for r := range 2 {
		res.Regions[r].Wait = Summarize(waits[r])
	}
	res.Peak = m.Peak()
	return res, nil
}

// writeLayers writes the layers tables, if the scenario ran.
func writeLayers(w io.Writer, r *Report) {
	var lat, share [][]string
	var first *LayersResult
	for _, s := range r.Systems {
		if s.Skipped != "" {
			continue
		}
		if e := s.Errs["layers"]; e != "" {
			lat = append(lat, []string{s.Label, "failed: " + e})
		}
		lr := s.Layers
		if lr == nil {
			continue
		}
		if first == nil {
			first = lr
		}
		verdict := func(block, plain Summary) string {
			ratio := float64(block.P50) / float64(plain.P50)
			if ratio > 1.5 {
				return fmt.Sprintf("missed (%.2f×)", ratio)
			}
			return fmt.Sprintf("met (%.2f×)", ratio)
		}
		cell := func(s Summary) string { return fmtDur(s.P50) + " / " + fmtDur(s.P99) }
		lat = append(lat,
			[]string{s.Label, "acquire", fmtDur(lr.RTT), cell(lr.Plain), cell(lr.Exact), cell(lr.Block), verdict(lr.Block, lr.Plain)},
			[]string{s.Label, "acquire + release", fmtDur(lr.RTT), cell(lr.PlainCycle), cell(lr.ExactCycle), cell(lr.BlockCycle),
				verdict(lr.BlockCycle, lr.PlainCycle)})
		for i, g := range lr.Regions {
			h, wk := lr.Share(i)
			off := h/wk - 1
			mark := "within 20%"
			if off > 0.2 || off < -0.2 {
				mark = "outside 20%"
			}
			share = append(share, []string{s.Label, fmt.Sprintf("region %d", i+1), fmt.Sprintf("%d (%.0f%%)", g.Workers, 100*wk),
				fmt.Sprintf("%s (%.0f%%)", thousands(float64(g.Holds)), 100*h), fmt.Sprintf("%+.0f%%: %s", 100*off, mark),
				fmtDur(g.Wait.P50) + " / " + fmtDur(g.Wait.P99), fmt.Sprintf("%d of %d", lr.Peak, lr.Global)})
		}
	}
	if len(lat) == 0 {
		return
	}
	fmt.Fprintf(w, "## Limits in layers\n\n")
	writeTable(w, []string{"system", "timed", "global round trip added", "regional alone p50 / p99", "exact mode (AcquireAll)",
		"block mode (warm)", "block p50 ≤ 1.5× regional"}, lat)
	if len(share) > 0 {
		writeTable(w, []string{"system", "region", "workers (share)", "holds (share)", "share of holds vs workers",
			"wait p50 / p99", "most inside (global)"}, share)
	}
	if first != nil {
		fmt.Fprintf(w, "The global semaphore is reached through the fault proxy, which delays every byte %s each way; the "+
			"regional ones directly. One caller times its acquire, and its acquire + release, with the regional semaphore alone, "+
			"with AcquireAll(global, regional) (exact mode) and with AcquireAll(tokensem.NewBlock(global), regional) "+
			"(block mode, after a warm-up). Then two regions, each with a Block of its own on a connection of its own, "+
			"run their workers for %s (AcquireAll → hold %s → release) on a global limit of %d; the regions' own limits "+
			"have room for every worker. A region's fair share is its share of the workers (its demand); an atomic "+
			"meter across both regions counts the most holders at once.\n\n",
			fmtDur(first.RTT/2), first.Duration, fmtDur(first.Hold), first.Global)
	}
}

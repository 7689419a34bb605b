package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// Playing the protocols of natsproto.go under the harness's contention and
// handoff scenarios, and reporting them beside natssem.

// NATSProtocolResult is what one protocol measured; nil fields did not run.
type NATSProtocolResult struct {
	Protocol   string
	Contention *NATSProtocolContention
	Handoff    *Summary // to a waiter idle for the run's -handoff-idle
	HandoffHot *Summary // to a waiter released at once
}

// NATSProtocolContention is one protocol's contention run.
type NATSProtocolContention struct {
	Protocol     string
	Workers, N   int
	Acquisitions int
	Throughput   float64 // acquisitions per second
	Ceiling      float64 // N / hold
	MeanHold     time.Duration
	Gap          Summary // release call to the next holder's claim, per slot
	Fair         Fairness
	Peak         int // most holders at once
	Conflicts    int // compare-and-sets lost (none expected)
}

// Percent is the throughput as a share of the ceiling.
func (c *NATSProtocolContention) Percent() float64 { return 100 * c.Throughput / c.Ceiling }

// playProtocols plays every protocol's contention and handoff scenarios,
// those of them the run selected, into res.
func (n *natsSystem) playProtocols(ctx context.Context, cfg *config, handoffs int, res *SystemResult, logf func(string, ...any)) {
	for _, proto := range natsProtocols {
		pr := res.natsProtocol(proto)
		if cfg.has("contention") {
			r, err := n.natsProtocolContention(ctx, proto, cfg.workers, cfg.permits, cfg.hold, cfg.duration, !cfg.sleepHold)
			if err != nil {
				logf("NATS %s protocol contention: %v", proto, err)
			} else {
				pr.Contention = r
				logf("NATS %s protocol contention (plain nats.go): %.0f/s (%.0f%% of %.0f/s), max/min %.2f, peak holders %d, "+
					"slot idle p50 %s mean %s, mean hold %s, lost compare-and-sets %d", proto, r.Throughput, r.Percent(), r.Ceiling,
					r.Fair.MaxMin, r.Peak, fmtDur(r.Gap.P50), fmtDur(r.Gap.Mean), fmtDur(r.MeanHold), r.Conflicts)
			}
		}
		if !cfg.has("handoff") {
			continue
		}
		for _, idle := range []time.Duration{cfg.idle, 0} {
			r, err := n.natsProtocolHandoff(ctx, proto, handoffs, idle)
			if err != nil {
				logf("NATS %s protocol handoff: %v", proto, err)
				break
			}
			if idle > 0 {
				pr.Handoff = &r
			} else {
				pr.HandoffHot = &r
			}
			logf("NATS %s protocol handoff (plain nats.go, waiter idle %s): p50 %s p99 %s", proto, fmtDur(idle), fmtDur(r.P50), fmtDur(r.P99))
			if idle == 0 {
				break
			}
		}
	}
}

// natsProtocolContention runs protocol p for dur after a second of
// warm-up: workers on connections of their own loop acquire, hold for
// hold, release, on n permits.
func (n *natsSystem) natsProtocolContention(ctx context.Context, p string, workers, permits int, hold, dur time.Duration, precise bool) (*NATSProtocolContention, error) {
	cleanup, err := n.protoSetup(ctx, p, permits)
	if err != nil {
		return nil, fmt.Errorf("%s protocol: %w", p, err)
	}
	defer cleanup()

	var (
		counting  atomic.Bool
		stop      = make(chan struct{})
		mu        sync.Mutex
		counts    = make([]int, workers)
		holds     time.Duration
		conflicts atomic.Int64
		errs      []error
		wg        sync.WaitGroup
		meter     Meter
		// released[i]: when slot i's last holder began its release.
		released = make([]atomic.Int64, permits)
		gaps     []time.Duration
	)
	ops := opsOf(p)
	for w := range workers {
		nc, err := nats.Connect(n.url, nats.Name(fmt.Sprintf("bench-proto-%d", w)))
		if err != nil {
			close(stop)
			wg.Wait()
			return nil, err
		}
		defer nc.Close()
		pl, err := newPuller(nc, protoStream(p))
		if err != nil {
			close(stop)
			wg.Wait()
			return nil, err
		}
		wg.Go(func() {
			holder := []byte(fmt.Sprintf(`{"h":"w%d"}`, w))
			for {
				m, err := pl.pull(stop)
				if err != nil || m == nil {
					if err != nil {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
					}
					return
				}
				h, err := ops.acquire(nc, m, holder)
				if errors.Is(err, errLost) {
					conflicts.Add(1)
					continue
				}
				if err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("slot %d: %w", h.idx, err))
					mu.Unlock()
					return
				}
				if r := released[h.idx].Load(); r != 0 && counting.Load() {
					g := time.Duration(time.Now().UnixNano() - r)
					mu.Lock()
					gaps = append(gaps, g)
					mu.Unlock()
				}
				meter.Enter()
				t0 := time.Now()
				holdFor(hold, precise)
				heldFor := time.Since(t0)
				meter.Leave()
				released[h.idx].Store(time.Now().UnixNano())
				if err := ops.release(nc, h); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("slot %d: %w", h.idx, err))
					mu.Unlock()
					return
				}
				if counting.Load() {
					mu.Lock()
					counts[w]++
					holds += heldFor
					mu.Unlock()
				}
			}
		})
	}
	select {
	case <-time.After(time.Second):
	case <-ctx.Done():
	}
	counting.Store(true)
	select {
	case <-time.After(dur):
	case <-ctx.Done():
	}
	counting.Store(false)
	close(stop)
	wg.Wait()
	if err := joinDistinct(errs); err != nil {
		return nil, err
	}
	total := 0
	for _, c := range counts {
		total += c
	}
	r := &NATSProtocolContention{Protocol: p, Workers: workers, N: permits, Acquisitions: total,
		Throughput: float64(total) / dur.Seconds(), Ceiling: float64(permits) / hold.Seconds(),
		Gap: Summarize(gaps), Fair: FairnessOf(counts), Peak: meter.Peak(), Conflicts: int(conflicts.Load())}
	if total > 0 {
		r.MeanHold = holds / time.Duration(total)
	}
	if r.Peak > permits {
		return r, fmt.Errorf("%s protocol: %d holders at once on %d permits", p, r.Peak, permits)
	}
	return r, ctx.Err()
}

// natsProtocolHandoff times protocol p's handoff on one permit: a holder
// releases once the consumer counts the other client's pull waiting and
// idle has passed; the time runs from the release call to the waiter
// holding. The two clients swap roles after each sample.
func (n *natsSystem) natsProtocolHandoff(ctx context.Context, p string, samples int, idle time.Duration) (Summary, error) {
	cleanup, err := n.protoSetup(ctx, p, 1)
	if err != nil {
		return Summary{}, fmt.Errorf("%s protocol: %w", p, err)
	}
	defer cleanup()
	stream := protoStream(p)
	cons, err := n.js.Consumer(ctx, stream, "holders")
	if err != nil {
		return Summary{}, err
	}
	ops := opsOf(p)
	type client struct {
		nc *nats.Conn
		pl *protoPuller
	}
	var cl [2]client
	for i := range cl {
		nc, err := nats.Connect(n.url, nats.Name(fmt.Sprintf("bench-proto-handoff-%d", i)))
		if err != nil {
			return Summary{}, err
		}
		defer nc.Close()
		pl, err := newPuller(nc, stream)
		if err != nil {
			return Summary{}, err
		}
		cl[i] = client{nc, pl}
	}
	never := make(chan struct{})
	m, err := cl[0].pl.pull(never)
	if err != nil {
		return Summary{}, err
	}
	held, err := ops.acquire(cl[0].nc, m, []byte(`{"h":"0"}`))
	if err != nil {
		return Summary{}, err
	}
	type got struct {
		h   protoHeld
		at  time.Time
		err error
	}
	var out []time.Duration
	holder := 0
	for i := range samples + samples/10 {
		waiter := 1 - holder
		ch := make(chan got, 1)
		go func() {
			m, err := cl[waiter].pl.pull(never)
			if err != nil {
				ch <- got{err: err}
				return
			}
			h, err := ops.acquire(cl[waiter].nc, m, []byte(`{"h":"w"}`))
			ch <- got{h, time.Now(), err}
		}()
		for {
			ci, err := cons.Info(ctx)
			if err != nil {
				return Summary{}, err
			}
			if ci.NumWaiting > 0 {
				break
			}
			if ctx.Err() != nil {
				return Summary{}, ctx.Err()
			}
		}
		if idle > 0 {
			time.Sleep(idle)
		}
		t0 := time.Now()
		if err := ops.release(cl[holder].nc, held); err != nil {
			return Summary{}, err
		}
		g := <-ch
		if g.err != nil {
			return Summary{}, g.err
		}
		if i >= samples/10 {
			out = append(out, g.at.Sub(t0))
		}
		held, holder = g.h, waiter
	}
	_ = ops.release(cl[holder].nc, held)
	return Summarize(out), nil
}

// natsProtocol returns the result of protocol p, adding it if new.
func (s *SystemResult) natsProtocol(p string) *NATSProtocolResult {
	for _, r := range s.NATSProtocols {
		if r.Protocol == p {
			return r
		}
	}
	r := &NATSProtocolResult{Protocol: p}
	s.NATSProtocols = append(s.NATSProtocols, r)
	return r
}

// protoLabels say what each protocol's handoff is, for the report.
var protoLabels = map[string][2]string{
	protoQueue:    {"work queue alone: Nak, push (no semaphore: a stale Nak or Ack acts on another's token)", "no"},
	protoRegister: {"register: release publishes the next token by compare-and-set, push, claim by compare-and-set at the token's sequence", "yes"},
	protoKV:       {"natssem's: release compare-and-set, Nak, push, read, claim compare-and-set", "yes"},
}

// writeNATSProtocols writes the protocols' table: each played with plain
// nats.go in the same run, beside natssem itself.
func writeNATSProtocols(w io.Writer, r *Report, ns *SystemResult) {
	redis := r.system("redis-fast")
	fmt.Fprintf(w, "NATS protocols without the library, in the same run (plain nats.go, %d workers on N=%d as above; "+
		"handoffs as above; bench/natsproto.go):\n\n", r.Workers, r.Permits)
	header := []string{"protocol", "fenced", "contention throughput", "× redis 1–5 ms", "slot idle p50", "fairness max/min",
		"handoff to an idle waiter p50", "to a running waiter p50"}
	row := func(name, fenced string, thr float64, idle, h, hot string, fair float64) []string {
		out := []string{name, fenced, "", "", idle, "", h, hot}
		if thr > 0 {
			out[2] = fmt.Sprintf("%s/s (%.0f%%)", thousands(thr), 100*thr/(float64(r.Permits)/r.Hold.Seconds()))
			out[5] = fmt.Sprintf("%.2f", fair)
			if redis != nil && redis.Contention != nil {
				out[3] = fmt.Sprintf("%.2f×", thr/redis.Contention.Throughput)
			}
		}
		return out
	}
	sum := func(s *Summary) string {
		if s == nil {
			return ""
		}
		return fmtDur(s.P50)
	}
	var rows [][]string
	for _, p := range ns.NATSProtocols {
		var thr, fair float64
		var idle string
		if c := p.Contention; c != nil {
			thr, fair, idle = c.Throughput, c.Fair.MaxMin, fmtDur(c.Gap.P50)
		}
		rows = append(rows, row(protoLabels[p.Protocol][0], protoLabels[p.Protocol][1], thr, idle,
			sum(p.Handoff), sum(p.HandoffHot), fair))
	}
	var thr, fair float64
	var idle, h, hot string
	if c := ns.Contention; c != nil {
		thr, fair, idle = c.Throughput, c.Fair.MaxMin, fmtDur(c.Gap.P50)
	}
	if ns.Handoff != nil {
		h = fmtDur(ns.Handoff.P50)
	}
	if ns.HandoffHot != nil {
		hot = fmtDur(ns.HandoffHot.P50)
	}
	rows = append(rows, row("natssem (the library, above)", "yes", thr, idle, h, hot, fair))
	writeTable(w, header, rows)
}

// protocolsVersusRedis says, for the contention target against Redis, what
// the protocols reached in the same run, and whether the broker's own
// handoff does.
func protocolsVersusRedis(s *SystemResult, redis *ContentionResult) string {
	get := func(p string) *NATSProtocolContention {
		for _, r := range s.NATSProtocols {
			if r.Protocol == p {
				return r.Contention
			}
		}
		return nil
	}
	q, reg, kv := get(protoQueue), get(protoRegister), get(protoKV)
	if q == nil || reg == nil || kv == nil {
		return ""
	}
	ratio := func(c *NATSProtocolContention) string {
		return fmt.Sprintf("%s/s = %.2f×", thousands(c.Throughput), c.Throughput/redis.Throughput)
	}
	verdict := "so no protocol that hands a token on through a JetStream consumer and fences it can reach 1.0× here: " +
		"the broker's own handoff is the limit"
	if q.Throughput >= redis.Throughput && reg.Throughput < redis.Throughput {
		verdict = "the broker's bare handoff reaches the Redis poller, and the fenced protocols stay below it by the " +
			"claim's confirmed write, which a safe semaphore on JetStream cannot skip (acks are not fenced)"
	} else if reg.Throughput >= redis.Throughput {
		verdict = "the register protocol reaches it, so the gap is natssem's protocol, not the broker"
	}
	return fmt.Sprintf("; with plain nats.go in the same run, the work queue alone (a Nak hands the token to the next "+
		"pull; no semaphore) reached %s, natssem's protocol %s, the register protocol (one write per handoff) %s: %s",
		ratio(q), ratio(kv), ratio(reg), verdict)
}

// protocolsHandoff says, for a handoff ratio target, what each protocol's
// handoff took in the same run against the same raw round trip.
func protocolsHandoff(s *SystemResult, hot bool, raw time.Duration) string {
	var parts []string
	for _, r := range s.NATSProtocols {
		h := r.Handoff
		if hot {
			h = r.HandoffHot
		}
		if h == nil {
			continue
		}
		name := map[string]string{protoQueue: "the work queue alone (no semaphore)", protoRegister: "the register protocol",
			protoKV: "natssem's protocol"}[r.Protocol]
		parts = append(parts, fmt.Sprintf("%s %s (%.1f×)", name, fmtDur(h.P50), float64(h.P50)/float64(raw)))
	}
	if len(parts) == 0 {
		return ""
	}
	return "; with plain nats.go in the same run: " + strings.Join(parts, ", ")
}

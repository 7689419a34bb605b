package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokensem/tokensem"
)

// The protocols of natsproto.go, played through the very scenarios that
// measure natssem (runContention, runHandoff) on the same server, so that
// what differs between them and natssem is the library alone; and their
// report beside natssem.

// NATSProtocolResult is what one protocol measured; nil fields did not run.
type NATSProtocolResult struct {
	Protocol   string
	Contention *ContentionResult
	Conflicts  int64          // compare-and-sets lost over the whole run (none expected on one server)
	Handoff    *HandoffResult // to a waiter idle for the run's -handoff-idle
	HandoffHot *HandoffResult // to a waiter released at once
}

// playProtocols plays every protocol's contention and handoff scenarios,
// those of them the run selected, into res.
func (n *natsSystem) playProtocols(ctx context.Context, cfg *config, handoffs int, res *SystemResult, logf func(string, ...any)) {
	for _, proto := range natsProtocols {
		ps := &protoSystem{n: n, p: proto, ops: opsOf(proto)}
		pr := res.natsProtocol(proto)
		name := "proto-" + proto
		if cfg.has("contention") {
			r, err := runContention(ctx, ps, name, cfg.workers, cfg.permits, cfg.hold, cfg.duration, !cfg.sleepHold)
			switch {
			case err != nil:
				logf("NATS %s protocol contention: %v", proto, err)
			case r.Peak > r.N:
				logf("NATS %s protocol contention: %d holders at once on %d permits", proto, r.Peak, r.N)
			default:
				pr.Contention = r
				logf("NATS %s protocol contention (plain nats.go): %.0f/s (%.0f%% of %.0f/s), max/min %.2f, peak holders %d, "+
					"slot idle p50 %s mean %s, mean hold %s", proto, r.Throughput, r.Percent(), r.Ceiling,
					r.Fair.MaxMin, r.Peak, fmtDur(r.Gap.P50), fmtDur(r.Gap.Mean), fmtDur(r.MeanHold))
			}
		}
		if cfg.has("handoff") {
			for _, idle := range []time.Duration{cfg.idle, 0} {
				r, err := runHandoff(ctx, ps, name, handoffs, idle, 0)
				if err != nil {
					logf("NATS %s protocol handoff: %v", proto, err)
					break
				}
				if idle > 0 {
					pr.Handoff = r
				} else {
					pr.HandoffHot = r
				}
				logf("NATS %s protocol handoff (plain nats.go, waiter idle %s): p50 %s p99 %s", proto, fmtDur(idle), fmtDur(r.P50), fmtDur(r.P99))
				if idle == 0 {
					break
				}
			}
		}
		pr.Conflicts = ps.conflicts.Load()
	}
}

// protoSystem is protocol p on n's server, as a System.
type protoSystem struct {
	n         *natsSystem
	p         string
	ops       protoOps
	conflicts atomic.Int64
}

func (s *protoSystem) Key() string   { return "nats-" + s.p }
func (s *protoSystem) Label() string { return "NATS " + s.p + " protocol (plain nats.go)" }

func (s *protoSystem) Connect(context.Context) (Client, error) {
	nc, err := nats.Connect(s.n.url, nats.Name("bench-proto-"+s.p))
	if err != nil {
		return nil, err
	}
	return &protoClient{s: s, nc: nc}, nil
}

// Waiting counts the pulls waiting at the protocol's consumer (there is one
// semaphore per protocol: name does not matter).
func (s *protoSystem) Waiting(ctx context.Context, _ string) (int, error) {
	return pullsWaiting(ctx, s.n.js, protoStream(s.p), "holders")
}

func (s *protoSystem) WaitersPerClient() int { return 0 }

func (s *protoSystem) Cleanup(ctx context.Context, _ string) { s.n.protoRemove(ctx, s.p) }

func (s *protoSystem) Close() {}

type protoClient struct {
	s  *protoSystem
	nc *nats.Conn
}

// Init makes the protocol's streams afresh with n tokens.
func (c *protoClient) Init(ctx context.Context, name string, n, _ int) (Sem, error) {
	if err := c.s.n.protoSetup(ctx, c.s.p, n); err != nil {
		return nil, fmt.Errorf("%s protocol: %w", c.s.p, err)
	}
	return c.Open(ctx, name)
}

func (c *protoClient) Open(context.Context, string) (Sem, error) {
	pl, err := newPuller(c.nc, protoStream(c.s.p))
	if err != nil {
		return nil, err
	}
	return &protoSem{c: c, pl: pl}, nil
}

func (c *protoClient) Close() error { c.nc.Close(); return nil }

// protoSem waits in one pull at a time, as a natssem waiter does.
type protoSem struct {
	c  *protoClient
	pl *protoPuller
}

var protoHolder = []byte(`{"h":"bench"}`)

func (s *protoSem) Acquire(ctx context.Context) (Held, error) {
	for {
		m, err := s.pl.pull(ctx.Done())
		if err != nil {
			return nil, err
		}
		if m == nil {
			return nil, ctx.Err()
		}
		h, err := s.c.s.ops.acquire(s.c.nc, m, protoHolder)
		if errors.Is(err, errLost) {
			s.c.s.conflicts.Add(1)
			continue // a stale or duplicate delivery: wait for another
		}
		if err != nil {
			return nil, err
		}
		return protoPermit{c: s.c, h: h}, nil
	}
}

func (s *protoSem) Status(context.Context) (Census, error) {
	return Census{}, errors.New("a protocol played without the library keeps no census")
}

func (s *protoSem) Close() error { return s.pl.sub.Unsubscribe() }

type protoPermit struct {
	c *protoClient
	h protoHeld
}

func (p protoPermit) Release(context.Context) error { return p.c.s.ops.release(p.c.nc, p.h) }

// Token gives the harness the slot, for the slot idle time.
func (p protoPermit) Token() tokensem.Token { return tokensem.Token{Index: p.h.idx} }

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

// protoText is how the report names a protocol: in its table (what its
// handoff is, and whether it is fenced) and in a sentence.
type protoText struct{ row, fenced, name string }

var protoTexts = map[string]protoText{
	protoQueue: {"work queue alone: Nak, push (no semaphore: a stale Nak or Ack acts on another's token)", "no",
		"the work queue alone (no semaphore)"},
	protoRegister: {"register: release publishes the next token by compare-and-set, push, claim by compare-and-set at the token's sequence", "yes",
		"the register protocol"},
	protoKV: {"natssem's: release compare-and-set, Nak, push, read, claim compare-and-set", "yes", "natssem's protocol"},
}

// writeNATSProtocols writes the protocols' table: each played with plain
// nats.go through the same scenarios in the same run, beside natssem.
func writeNATSProtocols(w io.Writer, r *Report, ns *SystemResult) {
	redis := r.system("redis-fast")
	fmt.Fprintf(w, "NATS protocols without the library, played through the same contention and handoff scenarios on the same "+
		"server right after natssem's (plain nats.go; bench/natsproto.go):\n\n")
	header := []string{"protocol", "fenced", "contention throughput", "× redis 1–5 ms", "slot idle p50", "fairness max/min",
		"handoff to an idle waiter p50", "to a running waiter p50"}
	row := func(name, fenced string, c *ContentionResult, h, hot *HandoffResult) []string {
		out := []string{name, fenced, "", "", "", "", "", ""}
		if c != nil {
			out[2] = fmt.Sprintf("%s/s (%.0f%%)", thousands(c.Throughput), c.Percent())
			out[4], out[5] = fmtDur(c.Gap.P50), fmt.Sprintf("%.2f", c.Fair.MaxMin)
			if redis != nil && redis.Contention != nil {
				out[3] = fmt.Sprintf("%.2f×", c.Throughput/redis.Contention.Throughput)
			}
		}
		if h != nil {
			out[6] = fmtDur(h.P50)
		}
		if hot != nil {
			out[7] = fmtDur(hot.P50)
		}
		return out
	}
	var rows [][]string
	for _, p := range ns.NATSProtocols {
		rows = append(rows, row(protoTexts[p.Protocol].row, protoTexts[p.Protocol].fenced, p.Contention, p.Handoff, p.HandoffHot))
	}
	rows = append(rows, row("natssem (the library, above)", "yes", ns.Contention, ns.Handoff, ns.HandoffHot))
	writeTable(w, header, rows)
}

// protocolsVersusRedis says, for the contention target against Redis, what
// the protocols reached in the same run, and whether the broker's own
// handoff does.
func protocolsVersusRedis(s *SystemResult, redis *ContentionResult) string {
	get := func(p string) *ContentionResult {
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
	ratio := func(c *ContentionResult) string {
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

// protocolsHandoff says, for a handoff ratio target (limit × raw), what
// each protocol's handoff took in the same run, and whose the gap is.
func protocolsHandoff(s *SystemResult, hot bool, raw time.Duration, limit float64) string {
	var parts []string
	ratios := map[string]float64{}
	for _, r := range s.NATSProtocols {
		h := r.Handoff
		if hot {
			h = r.HandoffHot
		}
		if h == nil {
			continue
		}
		ratios[r.Protocol] = float64(h.P50) / float64(raw)
		parts = append(parts, fmt.Sprintf("%s %s (%.1f×)", protoTexts[r.Protocol].name, fmtDur(h.P50), ratios[r.Protocol]))
	}
	if len(parts) == 0 {
		return ""
	}
	out := "; with plain nats.go in the same run: " + strings.Join(parts, ", ")
	kv, okKV := ratios[protoKV]
	reg, okReg := ratios[protoRegister]
	switch {
	case okKV && kv <= limit:
		out += ": natssem's protocol meets the target without the library, so the gap is natssem's own (docs/notes/nats-handoff.md)"
	case okReg && reg <= limit:
		out += ": only a protocol with one write per handoff meets it"
	case okKV && okReg:
		out += ": no fenced protocol meets it on this machine"
	}
	return out
}

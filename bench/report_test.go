package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestWriteTable(t *testing.T) {
	var b bytes.Buffer
	writeTable(&b, []string{"a", "b", "c"}, [][]string{{"1", "x|y"}, {"2", "3", "4\n5"}})
	want := "| a | b | c |\n|---|---|---|\n| 1 | x\\|y |  |\n| 2 | 3 | 4; 5 |\n\n"
	if b.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", b.String(), want)
	}
}

// sampleReport is a run in which NATS misses its cycle target and meets
// the rest, and RabbitMQ misses its throughput target.
func sampleReport() *Report {
	nats := &SystemResult{Key: "natssem", Label: "natssem", Tokensem: true, Errs: map[string]string{},
		Cycle:      &CycleResult{Summary: Summary{N: 100, P50: 100 * time.Microsecond, P99: 400 * time.Microsecond}},
		Contention: &ContentionResult{Workers: 32, N: 4, Hold: time.Millisecond, Throughput: 3600, Ceiling: 4000, Peak: 4},
		Handoff:    &HandoffResult{Summary: Summary{N: 10, P50: 300 * time.Microsecond, P99: 900 * time.Microsecond}},
		Sems:       &SemsResult{Count: 1000, Clients: 1},
		PerKey: &PerKeyFloor{Count: 1000, Create: Summary{P50: time.Millisecond}, Lone: Summary{P50: 80 * time.Microsecond},
			Cycle: Summary{P50: 120 * time.Microsecond}},
		Waiters: &WaitersResult{Waiters: 5000, N: 4, Served: 5000, Complete: true, Peak: 4, HeapPerWaiter: 4096},
		BigN:    &BigNResult{N: 10000},
		Weighted: &WeightedResult{Workers: 12, N: 4, Hold: time.Millisecond, Units: 2000, Ceiling: 4000, Peak: 4,
			Classes: []WeightClass{{K: 1, Workers: 4, Acquisitions: 900}, {K: 2, Workers: 4, Acquisitions: 300}, {K: 3, Workers: 4, Acquisitions: 100}}},
	}
	amqp := &SystemResult{Key: "amqpsem", Label: "amqpsem", Tokensem: true, Errs: map[string]string{"bign": "boom"},
		Cycle:      &CycleResult{Summary: Summary{N: 100, P50: 900 * time.Microsecond}},
		Contention: &ContentionResult{Workers: 32, N: 4, Hold: time.Millisecond, Throughput: 2000, Ceiling: 4000, Peak: 4},
		Bounds:     []string{"waiters bounded to 1000"},
	}
	redis := &SystemResult{Key: "redis", Label: "redis zset, retry 50–200 ms", Errs: map[string]string{},
		Handoff: &HandoffResult{Summary: Summary{N: 3, P50: 60 * time.Millisecond}, Samples: ms(30, 60, 190)}}
	skipped := &SystemResult{Key: "redis-fast", Label: "redis zset, retry 1–5 ms", Skipped: "redis-server not found", Errs: map[string]string{}}
	return &Report{
		Machine: Machine{CPUs: 2, Go: "go1.26", NATS: "2.15.2", RabbitMQ: "3.10.8", LoadStart: "0.5 0.4 0.3", LoadEnd: "1.0 0.5 0.3"},
		Command: "cd bench && go run . -quick", Quick: true, Started: time.Unix(0, 0), Workers: 32, Permits: 4, Hold: time.Millisecond,
		RawRTT:  &Summary{N: 100, P50: 33 * time.Microsecond, P99: 100 * time.Microsecond},
		Prims:   &Primitives{CAS: Summary{P50: 26 * time.Microsecond}, NakPull: Summary{P50: 35 * time.Microsecond}},
		Systems: []*SystemResult{nats, amqp, redis, skipped},
	}
}

func TestTargets(t *testing.T) {
	got := map[string]string{}
	for _, tg := range Targets(sampleReport()) {
		got[tg.System+": "+tg.Goal] = tg.Status
	}
	want := map[string]string{
		"natssem: 1-client cycle p50 ≤ 2.5× raw core-NATS RTT":                      Missed, // 100/33 = 3.0×
		"natssem: handoff p50 ≤ 400 µs and p99 ≤ 1.00 ms":                           Met,
		"natssem: contention throughput ≥ 85% of the N/hold ceiling":                Met, // 90%
		"natssem: never more than N holders at once (atomic meter)":                 Met,
		"natssem: scale runs complete":                                              Met,
		"natssem: client memory ≤ 16 KiB per waiting caller (heap delta / waiters)": Met,
		"amqpsem: 1-client cycle p50 ≤ 1 ms":                                        Met,
		"amqpsem: handoff p50 ≤ 2.00 ms":                                            NotRun,
		"amqpsem: contention throughput ≥ 40% of the N/hold ceiling":                Met, // 50%
		"amqpsem: scale runs complete":                                              Missed,
		"amqpsem: client memory ≤ 16 KiB per waiting caller (heap delta / waiters)": NotRun,
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: %q, want %q", k, got[k], w)
		}
	}
	for k := range got {
		if strings.HasPrefix(k, "redis") {
			t.Errorf("a target for the Redis baseline: %s", k)
		}
	}
}

// TestTargetsAgainstTheRun: the performance issue's targets are ratios
// within one run (Redis 1-5 ms, raw core-NATS round trips, a lone cycle).
func TestTargetsAgainstTheRun(t *testing.T) {
	r := sampleReport()
	r.RawIdle = &Summary{N: 10, P50: 131 * time.Microsecond}
	ns := r.Systems[0]
	ns.Contention.Fair.MaxMin = 1.01
	ns.HandoffHot = &HandoffResult{Summary: Summary{N: 10, P50: 200 * time.Microsecond}} // 6.1× 33 µs
	ns.Sems = &SemsResult{Count: 10000, Init: Summary{P50: 13 * time.Millisecond}, Cycle: Summary{P50: 150 * time.Microsecond}}
	r.Systems[3] = &SystemResult{Key: "redis-fast", Label: "redis zset, retry 1–5 ms", Errs: map[string]string{},
		Contention: &ContentionResult{Workers: 32, N: 4, Hold: time.Millisecond, Throughput: 2719, Ceiling: 4000, Fair: Fairness{MaxMin: 1.21}}}
	want := map[string]string{
		"contention throughput ≥ 1.0× the Redis 1–5 ms variant's, fairness max/min ≤ 1.05":                    Met,    // 3600/2719 = 1.32×
		"handoff p50 to an idle waiter ≤ 3× an idle raw request-reply":                                        Met,    // 300/131 = 2.3×
		"handoff p50 to a running waiter ≤ 4× the back-to-back raw round trip":                                Missed, // 6.1×
		"10,000 semaphores on one server: create p50 ≤ 2 ms, acquire+release with all open ≤ 2× a lone cycle": Missed, // 13 ms
	}
	got := map[string]string{}
	for _, tg := range Targets(r) {
		if tg.System == "natssem" {
			got[tg.Goal] = tg.Status
		}
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: %q, want %q", k, got[k], w)
		}
	}
	r.AMQPPrims = &AMQPPrimitives{GetRequeue: Summary{P50: 500 * time.Microsecond}, Claim: Summary{P50: 300 * time.Microsecond},
		Push: Summary{P50: 400 * time.Microsecond}, ProtocolHandoff: Summary{N: 10, P50: 1400 * time.Microsecond}}
	r.Systems[1].Handoff = &HandoffResult{Summary: Summary{N: 10, P50: 2 * time.Millisecond}} // 2.9× 700 µs
	amqpWant := map[string]string{
		"cycle p50 ≤ 1.5× its primitives' floor (plain amqp091, same run)":   Met, // 900/800
		"handoff p50 ≤ 1.5× its primitives' floor (plain amqp091, same run)": Missed,
	}
	for _, tg := range Targets(r) {
		if w, ok := amqpWant[tg.Goal]; ok && tg.System == "amqpsem" && tg.Status != w {
			t.Errorf("amqpsem %s: %q, want %q", tg.Goal, tg.Status, w)
		}
		if tg.System == "amqpsem" && tg.Goal == "handoff p50 ≤ 1.5× its primitives' floor (plain amqp091, same run)" &&
			!strings.Contains(tg.Why, "amqpsem's protocol played bare with plain amqp091 in this run: p50 1.40 ms = 2.0× the floor") {
			t.Errorf("the handoff target's reason does not quote the protocol played bare: %s", tg.Why)
		}
	}
	for _, tg := range Targets(r) {
		if tg.System == "natssem" && strings.HasPrefix(tg.Goal, "10,000") &&
			!strings.Contains(tg.Why, "plain JetStream in this run: create p50 1.00 ms (a consumer, N tokens and a record), cycle 120 µs = 1.5× a lone key's 80.0 µs") {
			t.Errorf("the per-key target's reason does not quote the plain JetStream floor: %s", tg.Why)
		}
	}
	ns.Contention.Fair.MaxMin = 1.2
	ns.Sems.Count = 1000
	for _, tg := range Targets(r) {
		switch {
		case tg.System != "natssem":
		case strings.HasPrefix(tg.Goal, "contention throughput ≥ 1.0×") && tg.Status != Missed:
			t.Errorf("fairness 1.2: %s", tg.Status)
		case strings.HasPrefix(tg.Goal, "10,000") && tg.Status != NotRun:
			t.Errorf("measured at 1,000 semaphores: %s, want %s", tg.Status, NotRun)
		}
	}
}

func TestTargetsMemoryAndSafety(t *testing.T) {
	r := sampleReport()
	r.Systems[0].Waiters.HeapPerWaiter = 17 * 1024
	r.Systems[0].Contention.Peak = 5
	for _, tg := range Targets(r) {
		if tg.System == "natssem" && (strings.Contains(tg.Goal, "memory") || strings.Contains(tg.Goal, "holders")) && tg.Status != Missed {
			t.Errorf("%s: %s, want missed", tg.Goal, tg.Status)
		}
	}
}

func TestWriteMarkdown(t *testing.T) {
	var b bytes.Buffer
	if err := WriteMarkdown(&b, sampleReport(), "handoff.svg"); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	for _, want := range []string{
		"```sh\ncd bench && go run . -quick\n```",
		"| CPU | 2 × — |",
		"at start 0.5 0.4 0.3; at end 1.0 0.5 0.3",
		"| natssem | 1-client cycle p50 ≤ 2.5× raw core-NATS RTT | 100 µs = 3.0× raw RTT (33.0 µs) | **missed** |",
		"floor", // the missed cycle target is explained by the primitives
		"| 1-client acquire+release p50 | 33.0 µs | 100 µs | 900 µs | — |",
		"**redis-fast not run**: redis-server not found",
		"failed: boom",
		"waiters bounded to 1000",
		"![handoff latency CDF](handoff.svg)",
		"## How it is measured",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q", want)
		}
	}
	// Every table row has as many cells as its header.
	var cols int
	for _, line := range strings.Split(md, "\n") {
		if !strings.HasPrefix(line, "|") {
			cols = 0
			continue
		}
		n := strings.Count(strings.ReplaceAll(line, `\|`, ""), "|")
		if cols == 0 {
			cols = n
		} else if n != cols {
			t.Errorf("row with %d separators under a header with %d: %s", n, cols, line)
		}
	}
}

// onlyScenarios returns a copy of r with the results of the named scenarios
// alone, as a run with -scenarios would record them.
func onlyScenarios(r *Report, scenarios ...string) *Report {
	has := func(s string) bool { return slices.Contains(scenarios, s) }
	out := *r
	if !has("cycle") {
		out.RawRTT, out.Prims = nil, nil
	}
	if !has("handoff") {
		out.RawIdle, out.Idle = nil, 0
	}
	out.Systems = nil
	for _, s := range r.Systems {
		c := *s
		if !has("cycle") {
			c.Cycle = nil
		}
		if !has("contention") {
			c.Contention = nil
		}
		if !has("handoff") {
			c.Handoff, c.HandoffHot = nil, nil
		}
		if !has("sems") {
			c.Sems, c.PerKey = nil, nil
		}
		if !has("waiters") {
			c.Waiters = nil
		}
		if !has("bign") {
			c.BigN = nil
		}
		if !has("weighted") {
			c.Weighted = nil
		}
		out.Systems = append(out.Systems, &c)
	}
	return &out
}

// TestReportForEverySubset: -out writes bench.md for any subset of
// scenarios, and the handoff picture only when the handoff scenario ran
// (bench.md says so otherwise).
func TestReportForEverySubset(t *testing.T) {
	subsets := [][]string{{"contention", "cycle"}, allScenarios}
	for _, s := range allScenarios {
		subsets = append(subsets, []string{s})
	}
	for _, sub := range subsets {
		t.Run(strings.Join(sub, ","), func(t *testing.T) {
			dir := t.TempDir()
			if err := writeReport(dir, onlyScenarios(sampleReport(), sub...), io.Discard); err != nil {
				t.Fatalf("writeReport: %v", err)
			}
			md, err := os.ReadFile(filepath.Join(dir, "bench.md"))
			if err != nil {
				t.Fatal(err)
			}
			_, svgErr := os.Stat(filepath.Join(dir, "handoff.svg"))
			plotted := slices.Contains(sub, "handoff")
			switch {
			case plotted && svgErr != nil:
				t.Errorf("handoff ran but no handoff.svg: %v", svgErr)
			case plotted && !strings.Contains(string(md), "](handoff.svg)"):
				t.Errorf("bench.md does not show handoff.svg")
			case !plotted && svgErr == nil:
				t.Errorf("handoff.svg written though the handoff scenario did not run")
			case !plotted && !strings.Contains(string(md), "Not plotted: the handoff scenario did not run"):
				t.Errorf("bench.md does not say why the handoff plot is missing")
			}
		})
	}
}

// TestProtocolContentionVerdict: the amqpsem ceiling's reason says whether
// plain amqp091 doing the same broker operations reached the target.
func TestProtocolContentionVerdict(t *testing.T) {
	r := sampleReport()
	as := r.system("amqpsem")
	if as == nil {
		t.Fatal("sample report has no amqpsem")
	}
	as.Contention = &ContentionResult{N: 4, Hold: time.Millisecond, Ceiling: 4000, Throughput: 1000, MeanHold: time.Millisecond,
		Gap: Summary{N: 10, P50: 3 * time.Millisecond, Mean: 3 * time.Millisecond}}
	why := func() string {
		for _, tg := range Targets(r) {
			if tg.System == "amqpsem" && strings.HasPrefix(tg.Goal, "contention throughput") {
				return tg.Why
			}
		}
		t.Fatal("no amqpsem contention target")
		return ""
	}
	as.AMQPProtocol = &AMQPProtocolContention{Workers: 32, N: 4, Throughput: 1200, Ceiling: 4000}
	if w := why(); !strings.Contains(w, "30% (1,200/s") || !strings.Contains(w, "stays below the target") {
		t.Errorf("protocol at 30%%: %s", w)
	}
	as.AMQPProtocol.Throughput = 2000
	if w := why(); !strings.Contains(w, "the gap is the library's") {
		t.Errorf("protocol at 50%%: %s", w)
	}
}

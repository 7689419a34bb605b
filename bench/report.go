package main

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
)

// Machine describes where the run happened.
type Machine struct {
	CPUs               int
	CPUModel, Memory   string
	Go, Kernel         string
	NATS, RabbitMQ     string
	RabbitURL          string
	NATSURL            string // empty: embedded
	Redis              string
	LoadStart, LoadEnd string
}

// Report is everything one run measured.
type Report struct {
	Machine Machine
	Command string
	Quick   bool
	Started time.Time
	Elapsed time.Duration
	CPU     CPUUse // over the whole run

	Workers, Permits int
	Hold             time.Duration

	RawRTT  *Summary // core-NATS request-reply, two connections, back to back
	RawIdle *Summary // the same, each request after Idle of quiet
	Idle    time.Duration
	RawErr  string
	Prims   *Primitives
	Systems []*SystemResult
}

// SystemResult is what one system measured; nil fields did not run.
type SystemResult struct {
	Key, Label string
	Tokensem   bool
	Jitter     time.Duration // Redis: longest retry sleep
	Skipped    string        // why the system did not run
	Errs       map[string]string
	Bounds     []string

	Cycle      *CycleResult
	Contention *ContentionResult
	Handoff    *HandoffResult
	HandoffHot *HandoffResult // tokensem: released as soon as the broker counts the waiter
	Sems       *SemsResult
	Waiters    *WaitersResult
	BigN       *BigNResult
	Weighted   *WeightedResult
}

func (r *Report) system(key string) *SystemResult {
	for _, s := range r.Systems {
		if s.Key == key && s.Skipped == "" {
			return s
		}
	}
	return nil
}

// Target outcomes.
const (
	Met    = "met"
	Missed = "**missed**"
	NotRun = "not run"
)

// Target is one goal of the issue and how this run did against it.
type Target struct {
	System, Goal, Measured, Status, Why string
}

// Targets evaluates the run against the targets, system by
// system, and explains every miss with numbers from the same run.
func Targets(r *Report) []Target {
	var ts []Target
	add := func(sys, goal string, ok, ran bool, measured, why string) {
		t := Target{System: sys, Goal: goal, Measured: measured, Status: NotRun, Why: why}
		if ran {
			t.Status = Missed
			if ok {
				t.Status, t.Why = Met, ""
			}
		}
		ts = append(ts, t)
	}
	if ns := r.system("natssem"); ns != nil {
		ran := ns.Cycle != nil && r.RawRTT != nil
		var ok bool
		var got, why string
		if ran {
			ratio := float64(ns.Cycle.P50) / float64(r.RawRTT.P50)
			ok = ratio <= 2.5
			got = fmt.Sprintf("%s = %.1f× raw RTT (%s)", fmtDur(ns.Cycle.P50), ratio, fmtDur(r.RawRTT.P50))
			why = "a fenced cycle is three serialized server round trips (pull, claim compare-and-set, release compare-and-set)"
			if r.Prims != nil {
				floor := r.Prims.NakPull.P50 + 2*r.Prims.CAS.P50
				why = fmt.Sprintf("a fenced cycle is a Nak+pull and two KV compare-and-sets in sequence; those primitives alone, "+
					"with plain nats.go in this run, take %s + 2 × %s = %s = %.1f× raw RTT, so 2.5× is at or below the protocol's floor; "+
					"the cycle costs %.0f%% of that floor", fmtDur(r.Prims.NakPull.P50), fmtDur(r.Prims.CAS.P50), fmtDur(floor),
					float64(floor)/float64(r.RawRTT.P50), 100*float64(ns.Cycle.P50)/float64(floor))
			}
		}
		add(ns.Label, "1-client cycle p50 ≤ 2.5× raw core-NATS RTT", ok, ran, got, why)
		anatomy := "a handoff is the releaser's compare-and-set, its Nak, the server's delivery to the waiting pull and the " +
			"waiter's claim (a compare-and-set, after a read when its cached revision is stale): three to four round trips"
		if r.RawIdle != nil && r.RawRTT != nil {
			anatomy += fmt.Sprintf(", each slower from idle: a raw request-reply after %s of quiet took %s (p50) here against %s "+
				"back to back, because idle (virtual) CPUs and parked threads must be woken at every hop; -handoff-idle 0 "+
				"measures a waiter that is still running", fmtDur(r.Idle), fmtDur(r.RawIdle.P50), fmtDur(r.RawRTT.P50))
		}
		addHandoff(&ts, ns, 400*time.Microsecond, time.Millisecond, anatomy)
		addCeiling(&ts, ns, 85, 400*time.Microsecond)
		addSafety(&ts, ns)
		addScale(&ts, ns)
	}
	if as := r.system("amqpsem"); as != nil {
		ran := as.Cycle != nil
		var got string
		if ran {
			got = fmtDur(as.Cycle.P50) + " (p99 " + fmtDur(as.Cycle.P99) + ")"
		}
		add(as.Label, "1-client cycle p50 ≤ 1 ms", ran && as.Cycle.P50 <= time.Millisecond, ran, got,
			fmt.Sprintf("a cycle is a basic.get, a claim (exclusive consumer) and a requeue, and the quorum queue commits each "+
				"through Raft (basic.get alone measured 637 µs on this machine); machine CPU %s busy meanwhile", pctOf(as.Cycle, nil)))
		addHandoff(&ts, as, 2*time.Millisecond, 0,
			"the token is requeued through the quorum queue (a Raft commit) before the broker pushes it to the next consumer, which then claims its slot")
		addCeiling(&ts, as, 70, 2*time.Millisecond)
		addSafety(&ts, as)
		addScale(&ts, as)
	}
	return ts
}

// pctOf is the machine CPU busy share during a cycle or handoff run.
func pctOf(c *CycleResult, h *HandoffResult) string {
	switch {
	case c != nil:
		return fmt.Sprintf("%.0f%%", 100*c.CPU.MachineBusy)
	case h != nil:
		return fmt.Sprintf("%.0f%%", 100*h.CPU.MachineBusy)
	}
	return "?"
}

func addHandoff(ts *[]Target, s *SystemResult, p50, p99 time.Duration, anatomy string) {
	t := Target{System: s.Label, Status: NotRun}
	t.Goal = "handoff p50 ≤ " + fmtDur(p50)
	if p99 > 0 {
		t.Goal += " and p99 ≤ " + fmtDur(p99)
	}
	if h := s.Handoff; h != nil {
		t.Measured = "p50 " + fmtDur(h.P50) + ", p99 " + fmtDur(h.P99)
		t.Status = Met
		if h.P50 > p50 || (p99 > 0 && h.P99 > p99) {
			t.Status = Missed
			t.Why = anatomy + fmt.Sprintf("; machine CPU %s busy during these handoffs (other work on this shared machine counts: "+
				"a waiter or broker that waits for a core shows in the tail first)", pctOf(nil, h))
			if hot := s.HandoffHot; hot != nil {
				t.Why += fmt.Sprintf("; released as soon as the broker counts the waiter (still running), the same handoff took p50 %s, p99 %s",
					fmtDur(hot.P50), fmtDur(hot.P99))
			}
		}
	}
	*ts = append(*ts, t)
}

// addCeiling judges the contention throughput. A slot stands idle from one
// holder's Release to the next holder's return from Acquire, so with every
// worker busy the loop peaks at N/(hold + idle): a share pct of the
// ceiling needs a mean idle of at most hold × (100/pct − 1). handoffGoal is
// the handoff target of the same system, whose own bound it implies.
func addCeiling(ts *[]Target, s *SystemResult, pct float64, handoffGoal time.Duration) {
	t := Target{System: s.Label, Status: NotRun, Goal: fmt.Sprintf("contention throughput ≥ %.0f%% of the N/hold ceiling", pct)}
	c := s.Contention
	if c == nil {
		*ts = append(*ts, t)
		return
	}
	t.Measured = fmt.Sprintf("%.0f%% (%s/s of %s/s)", c.Percent(), thousands(c.Throughput), thousands(c.Ceiling))
	t.Status = Met
	if c.Percent() >= pct {
		*ts = append(*ts, t)
		return
	}
	t.Status = Missed
	need := time.Duration(float64(c.Hold) * (100/pct - 1))
	implied := 100 * float64(c.Hold) / float64(c.Hold+handoffGoal)
	t.Why = fmt.Sprintf("each slot stood idle %s on average (p50 %s) between one holder's Release and the next holder's return "+
		"from Acquire, and holds took %s, so the loop's best is N/(hold + idle) = %s/s; %.0f%% of the ceiling needs an idle of "+
		"at most %s, shorter than one handoff (the handoff target of %s alone caps the share at %.0f%% for a %s hold); machine CPU "+
		"%.0f%% busy during the run", fmtDur(c.Gap.Mean), fmtDur(c.Gap.P50), fmtDur(c.MeanHold),
		thousands(float64(c.N)/(c.MeanHold+c.Gap.Mean).Seconds()), pct, fmtDur(need), fmtDur(handoffGoal), implied,
		fmtDur(c.Hold), 100*c.CPU.MachineBusy)
	*ts = append(*ts, t)
}

func addSafety(ts *[]Target, s *SystemResult) {
	t := Target{System: s.Label, Status: NotRun, Goal: "never more than N holders at once (atomic meter)"}
	var parts []string
	ok := true
	if c := s.Contention; c != nil {
		parts = append(parts, fmt.Sprintf("contention: %d of N=%d", c.Peak, c.N))
		ok = ok && c.Peak <= c.N
	}
	if w := s.Waiters; w != nil && w.Served > 0 {
		parts = append(parts, fmt.Sprintf("waiters: %d of N=%d", w.Peak, w.N))
		ok = ok && w.Peak <= w.N
	}
	if len(parts) > 0 {
		t.Measured = strings.Join(parts, "; ")
		t.Status = Met
		if !ok {
			t.Status = Missed
		}
	}
	*ts = append(*ts, t)
}

func addScale(ts *[]Target, s *SystemResult) {
	var missing []string
	for _, sc := range []struct {
		name string
		ran  bool
	}{{"sems", s.Sems != nil}, {"waiters", s.Waiters != nil && s.Waiters.Complete}, {"bign", s.BigN != nil}} {
		if e, failed := s.Errs[sc.name]; failed {
			missing = append(missing, sc.name+": "+e)
		} else if !sc.ran {
			missing = append(missing, sc.name+": not run")
		}
	}
	t := Target{System: s.Label, Goal: "scale runs complete", Status: NotRun}
	if s.Sems != nil || s.Waiters != nil || s.BigN != nil || s.Errs["sems"] != "" || s.Errs["waiters"] != "" || s.Errs["bign"] != "" {
		t.Status, t.Measured = Met, "all complete"
		if len(s.Bounds) > 0 {
			t.Measured += " (" + strings.Join(s.Bounds, "; ") + ")"
		}
		if len(missing) > 0 {
			t.Status, t.Measured = Missed, strings.Join(missing, "; ")
		}
	}
	*ts = append(*ts, t)
	t = Target{System: s.Label, Goal: "client memory ≤ 16 KiB per waiting caller (heap delta / waiters)", Status: NotRun}
	if w := s.Waiters; w != nil && w.HeapPerWaiter != 0 {
		t.Measured = fmt.Sprintf("%s heap per waiter (+ %s goroutine stack)", fmtBytes(w.HeapPerWaiter), fmtBytes(w.StackPerWaiter))
		t.Status = Met
		if w.HeapPerWaiter > 16*1024 {
			t.Status = Missed
		}
	}
	*ts = append(*ts, t)
}

// writeTable writes a markdown table.
func writeTable(w io.Writer, header []string, rows [][]string) {
	line := func(cells []string) {
		for i := range cells {
			cells[i] = strings.ReplaceAll(strings.ReplaceAll(cells[i], "|", `\|`), "\n", "; ")
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
	}
	line(append([]string(nil), header...))
	sep := make([]string, len(header))
	for i := range sep {
		sep[i] = "---"
	}
	fmt.Fprintf(w, "|%s|\n", strings.Join(sep, "|"))
	for _, r := range rows {
		cells := make([]string, len(header))
		copy(cells, r)
		line(cells)
	}
	fmt.Fprintln(w)
}

// thousands prints v rounded, with thin-space-free comma grouping.
func thousands(v float64) string {
	s := strconv.FormatInt(int64(math.Round(v)), 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// WriteMarkdown writes the report. plot, if set, is the handoff plot's
// path relative to the markdown file.
func WriteMarkdown(w io.Writer, r *Report, plot string) error {
	ew := &errWriter{w: w}
	w = ew
	m := r.Machine
	fmt.Fprintf(w, "# tokensem benchmarks\n\n")
	prof := "full profile"
	if r.Quick {
		prof = "quick profile (short runs: fewer samples, 3 s of contention)"
	}
	fmt.Fprintf(w, "Generated by the bench harness (`bench/`, a module of its own) on %s, in %s, %s:\n\n",
		r.Started.UTC().Format("2006-01-02 15:04 UTC"), r.Elapsed.Round(time.Second), prof)
	fmt.Fprintf(w, "```sh\n%s\n```\n\n", r.Command)
	fmt.Fprintf(w, "Everything ran on one machine over loopback: the clients and the embedded NATS server in the harness's "+
		"process, RabbitMQ and Redis in processes of their own. Other work shared the machine; its load and CPU use are below, "+
		"and each miss below quotes the machine's CPU use while it was measured.\n\n")

	fmt.Fprintf(w, "## Machine\n\n")
	rows := [][]string{
		{"CPU", fmt.Sprintf("%d × %s", m.CPUs, orDash(m.CPUModel))},
		{"memory", orDash(m.Memory)},
		{"Go", m.Go},
		{"kernel", orDash(m.Kernel)},
		{"NATS", natsLine(m)},
		{"RabbitMQ", brokerVersion("RabbitMQ ", m.RabbitMQ, " at "+m.RabbitURL+" (quorum queue)")},
		{"Redis", brokerVersion("redis-server ", m.Redis, " (started by the harness on a random loopback port, no persistence)")},
		{"load average (1/5/15 min)", "at start " + m.LoadStart + "; at end " + m.LoadEnd},
		{"CPU use over the run", fmt.Sprintf("machine %.0f%% busy; this harness (clients and embedded NATS) %.2f cores",
			100*r.CPU.MachineBusy, r.CPU.HarnessCores)},
	}
	writeTable(w, []string{"", ""}, rows)

	fmt.Fprintf(w, "## Targets\n\n")
	var trows [][]string
	for _, t := range Targets(r) {
		trows = append(trows, []string{t.System, t.Goal, orDash(t.Measured), t.Status, t.Why})
	}
	writeTable(w, []string{"system", "target", "measured", "", "why"}, trows)

	writeCore(w, r)
	writeWeighted(w, r)
	writeScale(w, r)
	switch {
	case plot != "":
		fmt.Fprintf(w, "## Handoff latency\n\nRelease → a waiter blocked on another connection holds the permit; "+
			"cumulative distribution per system, log time axis.\n\n![handoff latency CDF](%s)\n\n", plot)
	case len(handoffSeries(r)) == 0:
		fmt.Fprintf(w, "## Handoff latency\n\nNot plotted: the handoff scenario did not run in this report "+
			"(`-scenarios` without `handoff`, or it failed on every system).\n\n")
	}
	writeReading(w, r)
	writeNotes(w, r)
	return ew.err
}

// writeReading points out, from this run's numbers, what the tables show
// that a glance could miss.
func writeReading(w io.Writer, r *Report) {
	var lines []string
	for _, s := range r.Systems {
		if s.Skipped != "" {
			continue
		}
		c := s.Contention
		if !s.Tokensem && c != nil {
			if c.Fair.CV >= 0.1 {
				lines = append(lines, fmt.Sprintf("**%s** reaches %.0f%% of the ceiling by being unfair: nothing queues, so a "+
					"worker that releases and asks again at once usually wins its own permit back while the others sleep "+
					"(acquisitions per worker %d to %d, CV %.2f; wait p50 %s but p99 %s).", s.Label, c.Percent(), c.Fair.Min,
					c.Fair.Max, c.Fair.CV, fmtDur(c.Wait.P50), fmtDur(c.Wait.P99)))
			} else {
				lines = append(lines, fmt.Sprintf("**%s** reaches %.0f%% of the ceiling by polling hard: a freed permit "+
					"goes to whoever asks next, often the worker that just released it (acquisitions per worker %d to %d, "+
					"CV %.2f; wait p50 %s, p99 %s); the cost shows with thousands of waiters below.", s.Label, c.Percent(),
					c.Fair.Min, c.Fair.Max, c.Fair.CV, fmtDur(c.Wait.P50), fmtDur(c.Wait.P99)))
			}
		}
		if s.Tokensem && c != nil {
			lines = append(lines, fmt.Sprintf("**%s** serves waiters in order: acquisitions per worker %d to %d (CV %.3f); "+
				"every wait is about the queue ahead (p50 %s for %d workers on %d permits).", s.Label, c.Fair.Min, c.Fair.Max,
				c.Fair.CV, fmtDur(c.Wait.P50), c.Workers, c.N))
		}
		if wr := s.Waiters; wr != nil && !wr.Complete && wr.Served > 0 {
			lines = append(lines, fmt.Sprintf("**%s** with %s waiters served only %s in %s: every waiter polls, and the "+
				"polling alone saturates the server.", s.Label, thousands(float64(wr.Waiters)), thousands(float64(wr.Served)), fmtDur(wr.ServedIn)))
		} else if wr != nil && wr.Complete && !s.Tokensem && wr.ServedIn > 10*wr.Ideal {
			lines = append(lines, fmt.Sprintf("**%s** took %s to serve %s waiters (ideal %s): every waiter polls, and "+
				"the polling alone saturates the server.", s.Label, fmtDur(wr.ServedIn), thousands(float64(wr.Waiters)), fmtDur(wr.Ideal)))
		}
		if wr := s.Waiters; wr != nil && s.Tokensem && wr.HeapPerWaiter+wr.StackPerWaiter > 16*1024 {
			lines = append(lines, fmt.Sprintf("**%s**: counting goroutine stacks too, a waiting caller costs %s (%s heap + %s "+
				"stacks: the caller's goroutine and, per waiter, the client's channel-close watcher and the AMQP library's "+
				"consumer buffer).", s.Label, fmtBytes(wr.HeapPerWaiter+wr.StackPerWaiter), fmtBytes(wr.HeapPerWaiter),
				fmtBytes(wr.StackPerWaiter)))
		}
		if b := s.BigN; b != nil && b.AfterCensus > 10*b.Cycle.P50 && b.Cycle.P50 > 0 {
			lines = append(lines, fmt.Sprintf("**%s** at N=%s: an acquire right after a census took %s (otherwise %s): the "+
				"census reads the ready tokens by taking them and puts them back, and the acquire waits behind those returns.",
				s.Label, thousands(float64(b.N)), fmtDur(b.AfterCensus), fmtDur(b.Cycle.P50)))
		}
	}
	if r.RawIdle != nil && r.RawRTT != nil {
		lines = append(lines, fmt.Sprintf("Waking an idle waiter costs more than a back-to-back round trip on this (virtual) "+
			"machine: a raw core-NATS request-reply after %s of quiet took %s (p50) against %s back to back, and every "+
			"handoff crosses several such wake-ups. `-handoff-idle 0` releases as soon as the broker counts the waiter.",
			fmtDur(r.Idle), fmtDur(r.RawIdle.P50), fmtDur(r.RawRTT.P50)))
	}
	if len(lines) == 0 {
		return
	}
	fmt.Fprintf(w, "## Reading the results\n\n")
	for _, l := range lines {
		fmt.Fprintf(w, "- %s\n", l)
	}
	fmt.Fprintln(w)
}

func natsLine(m Machine) string {
	if m.NATSURL != "" {
		return brokerVersion("nats-server ", m.NATS, " at "+m.NATSURL+" (a server of its own, not embedded)")
	}
	return brokerVersion("nats-server ", m.NATS, " (embedded in the harness process, loopback, file store, R1)")
}

func brokerVersion(prefix, v, suffix string) string {
	if v == "" {
		return "not run"
	}
	return prefix + v + suffix
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

// writeCore writes the per-scenario table: one column per system.
func writeCore(w io.Writer, r *Report) {
	fmt.Fprintf(w, "## Side by side\n\n")
	header := []string{"scenario"}
	if r.RawRTT != nil {
		header = append(header, "raw core-NATS request-reply")
	}
	var systems []*SystemResult
	for _, s := range r.Systems {
		if s.Skipped == "" {
			systems = append(systems, s)
			header = append(header, s.Label)
		}
	}
	cell := func(s *SystemResult, scenario string, f func() string) string {
		if e, ok := s.Errs[scenario]; ok {
			return "failed: " + e
		}
		return f()
	}
	row := func(label, raw string, f func(s *SystemResult) string) []string {
		out := []string{label}
		if r.RawRTT != nil {
			out = append(out, raw)
		}
		for _, s := range systems {
			out = append(out, f(s))
		}
		return out
	}
	dash := func(ok bool, f func() string) string {
		if !ok {
			return "—"
		}
		return f()
	}
	var raw50, raw99, rawIdle50, rawIdle99, rawHot string
	if r.RawRTT != nil {
		raw50, raw99 = fmtDur(r.RawRTT.P50), fmtDur(r.RawRTT.P99)
		rawHot = raw50 + " / " + raw99 + " (back to back)"
	}
	if r.RawIdle != nil {
		rawIdle50, rawIdle99 = fmtDur(r.RawIdle.P50)+" (a request after the same idle)", fmtDur(r.RawIdle.P99)
	}
	ceil := float64(r.Permits) / r.Hold.Seconds()
	label := fmt.Sprintf("%d workers, N=%d, %s hold", r.Workers, r.Permits, fmtDur(r.Hold))
	rows := [][]string{
		row("1-client acquire+release p50", raw50, func(s *SystemResult) string {
			return cell(s, "cycle", func() string { return dash(s.Cycle != nil, func() string { return fmtDur(s.Cycle.P50) }) })
		}),
		row("1-client acquire+release p99", raw99, func(s *SystemResult) string {
			return cell(s, "cycle", func() string { return dash(s.Cycle != nil, func() string { return fmtDur(s.Cycle.P99) }) })
		}),
		row(label+": throughput (ceiling "+thousands(ceil)+"/s)", "", func(s *SystemResult) string {
			return cell(s, "contention", func() string {
				return dash(s.Contention != nil, func() string {
					return fmt.Sprintf("%s/s (%.0f%%)", thousands(s.Contention.Throughput), s.Contention.Percent())
				})
			})
		}),
		row(label+": wait p50 / p99", "", func(s *SystemResult) string {
			return cell(s, "contention", func() string {
				return dash(s.Contention != nil, func() string {
					return fmtDur(s.Contention.Wait.P50) + " / " + fmtDur(s.Contention.Wait.P99)
				})
			})
		}),
		row(label+": fairness, max/min acquisitions per worker (CV)", "", func(s *SystemResult) string {
			return cell(s, "contention", func() string {
				return dash(s.Contention != nil, func() string {
					f := s.Contention.Fair
					mm := "∞"
					if !math.IsInf(f.MaxMin, 1) {
						mm = fmt.Sprintf("%.2f", f.MaxMin)
					}
					return fmt.Sprintf("%s (%d–%d; CV %.2f)", mm, f.Min, f.Max, f.CV)
				})
			})
		}),
		row(label+": slot idle between holders, p50 (mean)", "", func(s *SystemResult) string {
			return cell(s, "contention", func() string {
				return dash(s.Contention != nil && s.Contention.Gap.N > 0, func() string {
					return fmtDur(s.Contention.Gap.P50) + " (" + fmtDur(s.Contention.Gap.Mean) + ")"
				})
			})
		}),
		row(label+": measured mean hold", "", func(s *SystemResult) string {
			return cell(s, "contention", func() string {
				return dash(s.Contention != nil, func() string { return fmtDur(s.Contention.MeanHold) })
			})
		}),
		row(label+": most holders at once", "", func(s *SystemResult) string {
			return cell(s, "contention", func() string {
				return dash(s.Contention != nil, func() string {
					return fmt.Sprintf("%d of %d", s.Contention.Peak, s.Contention.N)
				})
			})
		}),
		row(fmt.Sprintf("handoff, release → waiter blocked (for %s) on another connection: p50", fmtDur(r.Idle)), rawIdle50, func(s *SystemResult) string {
			return cell(s, "handoff", func() string { return dash(s.Handoff != nil, func() string { return fmtDur(s.Handoff.P50) }) })
		}),
		row("handoff p99", rawIdle99, func(s *SystemResult) string {
			return cell(s, "handoff", func() string { return dash(s.Handoff != nil, func() string { return fmtDur(s.Handoff.P99) }) })
		}),
		row("handoff to a waiter released at once (not yet idle): p50 / p99", rawHot, func(s *SystemResult) string {
			return dash(s.HandoffHot != nil, func() string { return fmtDur(s.HandoffHot.P50) + " / " + fmtDur(s.HandoffHot.P99) })
		}),
	}
	writeTable(w, header, rows)
	var skipped []string
	for _, s := range r.Systems {
		if s.Skipped != "" {
			skipped = append(skipped, fmt.Sprintf("- **%s not run**: %s", s.Key, s.Skipped))
		}
	}
	if r.RawErr != "" {
		skipped = append(skipped, "- raw round trip failed: "+r.RawErr)
	}
	if len(skipped) > 0 {
		fmt.Fprintf(w, "%s\n\n", strings.Join(skipped, "\n"))
	}
	if r.Prims != nil && r.RawRTT != nil {
		floor := r.Prims.NakPull.P50 + 2*r.Prims.CAS.P50
		fmt.Fprintf(w, "JetStream primitives in the same run (plain nats.go): KV compare-and-set p50 %s, Nak + one-message "+
			"pull p50 %s; a fenced cycle needs one pull and two compare-and-sets in sequence, a floor of %s = %.1f× the raw round trip.\n\n",
			fmtDur(r.Prims.CAS.P50), fmtDur(r.Prims.NakPull.P50), fmtDur(floor), float64(floor)/float64(r.RawRTT.P50))
	}
}

// writeScale writes the scale table.
func writeScale(w io.Writer, r *Report) {
	var systems []*SystemResult
	for _, s := range r.Systems {
		if s.Skipped == "" && (s.Sems != nil || s.Waiters != nil || s.BigN != nil || s.Errs["sems"] != "" ||
			s.Errs["waiters"] != "" || s.Errs["bign"] != "") {
			systems = append(systems, s)
		}
	}
	if len(systems) == 0 {
		return
	}
	fmt.Fprintf(w, "## Scale\n\n")
	header := []string{"scenario"}
	for _, s := range systems {
		header = append(header, s.Label)
	}
	row := func(label, scenario string, f func(s *SystemResult) (string, bool)) []string {
		out := []string{label}
		for _, s := range systems {
			v, ok := f(s)
			switch {
			case ok:
				out = append(out, v)
			case s.Errs[scenario] != "":
				out = append(out, "failed: "+s.Errs[scenario])
			default:
				out = append(out, "—")
			}
		}
		return out
	}
	var rows [][]string
	rows = append(rows,
		row("many semaphores on one broker: count (client connections)", "sems", func(s *SystemResult) (string, bool) {
			if s.Sems == nil {
				return "", false
			}
			return fmt.Sprintf("%s (%d)", thousands(float64(s.Sems.Count)), s.Sems.Clients), true
		}),
		row("… create all (4 at a time); one Init p50", "sems", func(s *SystemResult) (string, bool) {
			if s.Sems == nil {
				return "", false
			}
			return fmtDur(s.Sems.InitTotal) + "; " + fmtDur(s.Sems.Init.P50), true
		}),
		row("… first acquire+release on each, all open: p50", "sems", func(s *SystemResult) (string, bool) {
			if s.Sems == nil {
				return "", false
			}
			return fmtDur(s.Sems.First.P50), true
		}),
		row("… second acquire+release on each: p50 / p99", "sems", func(s *SystemResult) (string, bool) {
			if s.Sems == nil {
				return "", false
			}
			return fmtDur(s.Sems.Cycle.P50) + " / " + fmtDur(s.Sems.Cycle.P99), true
		}),
		row("waiters on one semaphore (client connections)", "waiters", func(s *SystemResult) (string, bool) {
			if s.Waiters == nil {
				return "", false
			}
			return fmt.Sprintf("%s (%d)", thousands(float64(s.Waiters.Waiters)), s.Waiters.Clients), true
		}),
		row("… all counted waiting by the server after", "waiters", func(s *SystemResult) (string, bool) {
			if s.Waiters == nil || s.Waiters.QueuedIn == 0 {
				return "", false
			}
			return fmtDur(s.Waiters.QueuedIn), true
		}),
		row(fmt.Sprintf("… all served with N=%d, %s hold: time (ideal)", r.Permits, fmtDur(r.Hold)), "waiters", func(s *SystemResult) (string, bool) {
			wr := s.Waiters
			if wr == nil || wr.Served == 0 {
				return "", false
			}
			if !wr.Complete {
				return fmt.Sprintf("only %s of %s in %s", thousands(float64(wr.Served)), thousands(float64(wr.Waiters)), fmtDur(wr.ServedIn)), true
			}
			return fmt.Sprintf("%s (%s)", fmtDur(wr.ServedIn), fmtDur(wr.Ideal)), true
		}),
		row("… most holders at once", "waiters", func(s *SystemResult) (string, bool) {
			if s.Waiters == nil || s.Waiters.Served == 0 {
				return "", false
			}
			return fmt.Sprintf("%d of %d", s.Waiters.Peak, s.Waiters.N), true
		}),
		row("client memory per waiting caller: heap (+ goroutine stack)", "waiters", func(s *SystemResult) (string, bool) {
			if s.Waiters == nil || s.Waiters.HeapPerWaiter == 0 {
				return "", false
			}
			return fmtBytes(s.Waiters.HeapPerWaiter) + " (+ " + fmtBytes(s.Waiters.StackPerWaiter) + ")", true
		}),
		row("large semaphore: N", "bign", func(s *SystemResult) (string, bool) {
			if s.BigN == nil {
				return "", false
			}
			return thousands(float64(s.BigN.N)), true
		}),
		row("… init", "bign", func(s *SystemResult) (string, bool) {
			if s.BigN == nil || s.BigN.Init == 0 {
				return "", false
			}
			return fmtDur(s.BigN.Init), true
		}),
		row("… first acquire+release; the next ten: p50", "bign", func(s *SystemResult) (string, bool) {
			if s.BigN == nil || s.BigN.First == 0 {
				return "", false
			}
			return fmtDur(s.BigN.First) + "; " + fmtDur(s.BigN.Cycle.P50), true
		}),
		row("… Status (census of every token and holder) p50", "bign", func(s *SystemResult) (string, bool) {
			if s.BigN == nil || s.BigN.Status.N == 0 {
				return "", false
			}
			return fmtDur(s.BigN.Status.P50), true
		}),
		row("… acquire+release right after a census", "bign", func(s *SystemResult) (string, bool) {
			if s.BigN == nil || s.BigN.AfterCensus == 0 {
				return "", false
			}
			return fmtDur(s.BigN.AfterCensus), true
		}),
	)
	writeTable(w, header, rows)
	for _, s := range systems {
		if len(s.Bounds) > 0 {
			fmt.Fprintf(w, "- %s: %s.\n", s.Label, strings.Join(s.Bounds, "; "))
		}
	}
	fmt.Fprintln(w)
}

func writeNotes(w io.Writer, r *Report) {
	fmt.Fprintf(w, "## How it is measured\n\n")
	notes := []string{
		"**Raw round trip**: core-NATS request-reply between a requester and a responder on two connections of their own, " +
			"on the same embedded server; the reference for the NATS cycle target.",
		"**1-client cycle**: one client, a semaphore of one permit, Acquire then Release, timed together; a tenth more cycles run first as a warm-up.",
		fmt.Sprintf("**Contention**: %d workers, each on a connection of its own (its own NATS connection, amqpsem.Conn or "+
			"Redis client), loop Acquire → hold %s → Release on a semaphore of N=%d. The hold waits on a Linux timerfd: the Go "+
			"timer behind time.Sleep fires up to half a millisecond late on a busy 2-core machine (-sleep-hold uses it anyway); "+
			"the measured mean hold is in the table. "+
			"Throughput counts acquisitions begun inside the window; the ceiling is N/hold. *Wait* is the time in Acquire. "+
			"*Fairness* is the spread of acquisitions per worker: max/min (1.00 = even) and the coefficient of variation "+
			"(population standard deviation / mean; 0 = even). *Slot idle* is the time from a holder's Release call to the "+
			"next holder of the same token returning from Acquire (tokensem only: a Redis permit has no identity); with every "+
			"worker busy, throughput ≈ N / (hold + idle). *Most holders at once* comes from an atomic meter entered "+
			"right after Acquire returns and left right before Release.", r.Workers, fmtDur(r.Hold), r.Permits),
		"**Handoff**: a holder on one connection holds the only permit; a waiter on another connection calls Acquire; once " +
			"the broker counts it waiting (NATS: the consumer's waiting pulls; RabbitMQ: the token queue's consumers; Redis: " +
			"the waiter has been refused once and sleeps), the holder waits 1 ms more (the waiter has gone idle, as waiters usually " +
			"have) and releases, and the time runs from the Release call to the waiter's Acquire returning. A polling waiter is " +
			"released at a random point of its retry sleep (1 ms plus a uniform share of the longest sleep), so its samples cover " +
			"the whole retry cycle. RabbitMQ counts the holder of an unacked token as a consumer too, and its count lags a release " +
			"by ~1.5 ms, so the count is read until it holds still before the waiter starts, and the waiter counts once it rises above that. " +
			"For tokensem the handoff is measured a second time with the release as soon as the broker counts the waiter (its " +
			"goroutines still running): the gap between the two is the cost of waking an idle waiter on this machine.",
		"**Redis semaphore**: the classic sorted-set semaphore of the seed documents, one Lua script per attempt: " +
			"ZREMRANGEBYSCORE drops holders older than the lease (30 s), ZADD adds the caller scored with the server's TIME in µs, " +
			"ZRANK < N admits it, otherwise ZREM removes it and the caller sleeps a random jitter (50–200 ms as commonly advised, " +
			"or 1–5 ms) before it retries; Release is ZREM. No lease renewal is needed for these short holds. It keeps no queue, so " +
			"a releaser that asks again at once usually wins its own permit back.",
		"**Many semaphores**: that many semaphores of N permits created on one broker (4 Inits at a time; RabbitMQ clients " +
			"spread over connections of at most 1,000 semaphores, below its default channel_max of 2,047), then two rounds of one " +
			"acquire+release on each while all are open, then all deleted.",
		"**Waiters**: all N permits are held; the waiters call Acquire, on one client connection (RabbitMQ: one connection per " +
			"1,000 waiters, each waiter being a channel); once the broker counts them all waiting, the heap (runtime.MemStats.HeapAlloc " +
			"after two GCs) and goroutine stacks (StackInuse) are compared with before they started and divided by the number of waiters; " +
			"then the held permits are released and the time runs until every waiter has acquired, held and released.",
		"**Large semaphore**: Init of one semaphore of N permits, its first acquire+release, ten more, then Status (a census " +
			"of every token and holder) a few times, then one more acquire+release. A Redis sorted set stores holders, not tokens, " +
			"so its Init and census cost nothing at any N.",
	}
	for _, n := range notes {
		fmt.Fprintf(w, "- %s\n", n)
	}
	fmt.Fprintln(w)
	var obs []string
	for _, s := range r.Systems {
		if c := s.Contention; c != nil {
			obs = append(obs, fmt.Sprintf("%s: contention mean hold %s (ceiling with that hold %s/s), %s acquisitions in %s.",
				s.Label, fmtDur(c.MeanHold), thousands(float64(c.N)/c.MeanHold.Seconds()), thousands(float64(c.Acquisitions)), fmtDur(c.Duration)))
		}
		for sc, e := range s.Errs {
			obs = append(obs, fmt.Sprintf("%s: %s failed: %s", s.Label, sc, strings.ReplaceAll(e, "\n", "; ")))
		}
	}
	if len(obs) > 0 {
		fmt.Fprintf(w, "### This run\n\n")
		for _, o := range obs {
			fmt.Fprintf(w, "- %s\n", o)
		}
		fmt.Fprintln(w)
	}
}

type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}

// handoffSeries are the handoff samples of every system that has them.
func handoffSeries(r *Report) []Series {
	var s []Series
	for _, sys := range r.Systems {
		if sys.Handoff != nil && len(sys.Handoff.Samples) > 0 {
			s = append(s, Series{Label: sys.Label, Samples: sys.Handoff.Samples})
		}
	}
	return s
}

func handoffMarks() []Mark {
	return []Mark{
		{At: 400 * time.Microsecond, Label: "NATS p50 target"},
		{At: 2 * time.Millisecond, Label: "RabbitMQ p50 target"},
	}
}

func handoffTitle(r *Report) string {
	return fmt.Sprintf("Handoff latency: release → blocked waiter holds (%d CPUs, load %s)", r.Machine.CPUs, r.Machine.LoadStart)
}

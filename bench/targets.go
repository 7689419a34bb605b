package main

import (
	"fmt"
	"strings"
	"time"
)

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
		addVersusRedis(&ts, ns, r.system("redis-fast"))
		addHandoffRatios(&ts, ns, r)
		addManySems(&ts, ns)
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
			fmt.Sprintf("a cycle is a consume (its consume-ok), the push of the ready token, a claim (exclusive consumer), and "+
				"a release whose requeue is confirmed by a round trip; the quorum queue commits the consume, the push and the "+
				"requeue through Raft (see the primitives' floor below); machine CPU %s busy meanwhile", pctOf(as.Cycle, nil)))
		addHandoff(&ts, as, 2*time.Millisecond, 0,
			"the token is requeued through the quorum queue (a Raft commit) before the broker pushes it to the next consumer, which then claims its slot")
		addCeiling(&ts, as, 40, 2*time.Millisecond)
		if pc := as.AMQPProtocol; pc != nil && len(ts) > 0 && ts[len(ts)-1].Status == Missed {
			verdict := "the protocol itself stays below the target on this broker"
			if pc.Percent() >= 40 {
				verdict = "the protocol reaches the target, so the gap is the library's"
			}
			ts[len(ts)-1].Why += fmt.Sprintf("; plain amqp091 doing amqpsem's broker operations (consume, exclusive claim, cancel; "+
				"cancel, requeue and a confirming round trip) with the same workers right after: %.0f%% (%s/s, mean hold %s): %s",
				pc.Percent(), thousands(pc.Throughput), fmtDur(pc.MeanHold), verdict)
		}
		addAMQPFloor(&ts, as, r.AMQPPrims)
		addSafety(&ts, as)
		addScale(&ts, as)
	}
	adaptiveTargets(r, add)
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

// addVersusRedis judges natssem's contention throughput against the Redis
// semaphore that polls every 1-5 ms, in the same run, and its fairness.
func addVersusRedis(ts *[]Target, s, redis *SystemResult) {
	t := Target{System: s.Label, Status: NotRun,
		Goal: "contention throughput ≥ 1.0× the Redis 1–5 ms variant's, fairness max/min ≤ 1.05"}
	c := s.Contention
	if c == nil || redis == nil || redis.Contention == nil {
		*ts = append(*ts, t)
		return
	}
	rc := redis.Contention
	ratio := c.Throughput / rc.Throughput
	t.Measured = fmt.Sprintf("%s/s = %.2f× %s's %s/s; max/min %.2f (Redis %.2f)", thousands(c.Throughput), ratio,
		redis.Label, thousands(rc.Throughput), c.Fair.MaxMin, rc.Fair.MaxMin)
	t.Status = Met
	if ratio < 1 || c.Fair.MaxMin > 1.05 {
		t.Status = Missed
		t.Why = fmt.Sprintf("each slot stood idle %s on average between holders (p50 %s): the handoff's round trips in "+
			"sequence, while a Redis poller that wakes within 1–5 ms of a release takes the slot in one round trip, unfairly",
			fmtDur(c.Gap.Mean), fmtDur(c.Gap.P50)) + protocolsVersusRedis(s, rc)
	}
	*ts = append(*ts, t)
}

// addHandoffRatios judges natssem's handoff against core NATS in the same
// run: to an idle waiter against an idle request-reply, to a running one
// against back-to-back round trips.
func addHandoffRatios(ts *[]Target, s *SystemResult, r *Report) {
	for _, c := range []struct {
		goal  string
		h     *HandoffResult
		raw   *Summary
		limit float64
	}{
		{"handoff p50 to an idle waiter ≤ 3× an idle raw request-reply", s.Handoff, r.RawIdle, 3},
		{"handoff p50 to a running waiter ≤ 4× the back-to-back raw round trip", s.HandoffHot, r.RawRTT, 4},
	} {
		t := Target{System: s.Label, Goal: c.goal, Status: NotRun}
		if c.h != nil && c.raw != nil && c.raw.P50 > 0 {
			ratio := float64(c.h.P50) / float64(c.raw.P50)
			t.Measured = fmt.Sprintf("%s = %.1f× %s", fmtDur(c.h.P50), ratio, fmtDur(c.raw.P50))
			t.Status = Met
			if ratio > c.limit {
				t.Status = Missed
				t.Why = "a handoff is the releaser's compare-and-set, its Nak, the server's push to the waiting pull and the " +
					"waiter's claim compare-and-set: at least three round trips in sequence" + protocolsHandoff(s, c.h == s.HandoffHot, c.raw.P50, c.limit)
			}
		}
		*ts = append(*ts, t)
	}
}

// manySemsGoal is the number of semaphores the per-key targets are set at.
const manySemsGoal = 10000

// addManySems judges per-key cost: creating one of many semaphores, and a
// cycle with all of them open against a lone semaphore's cycle.
func addManySems(ts *[]Target, s *SystemResult) {
	t := Target{System: s.Label, Status: NotRun,
		Goal: fmt.Sprintf("%s semaphores on one server: create p50 ≤ 2 ms, acquire+release with all open ≤ 2× a lone cycle", thousands(manySemsGoal))}
	m := s.Sems
	if m == nil || s.Cycle == nil {
		*ts = append(*ts, t)
		return
	}
	ratio := float64(m.Cycle.P50) / float64(s.Cycle.P50)
	t.Measured = fmt.Sprintf("at %s: create p50 %s; cycle p50 %s = %.1f× a lone cycle (%s)",
		thousands(float64(m.Count)), fmtDur(m.Init.P50), fmtDur(m.Cycle.P50), ratio, fmtDur(s.Cycle.P50))
	if c := m.Server; c != nil {
		t.Measured += fmt.Sprintf("; the server's memory %s a semaphore", fmtBytes(c.HeapPerSem+c.StackPerSem))
	}
	createMet, cycleMet := m.Init.P50 <= 2*time.Millisecond, ratio <= 2
	switch {
	case m.Count < manySemsGoal:
		t.Why = fmt.Sprintf("measured at %s semaphores only (-sems %d measures the goal)", thousands(float64(m.Count)), manySemsGoal)
	case createMet && cycleMet:
		t.Status = Met
	default:
		t.Status = Missed
		t.Why = "each semaphore is a stream, a KV bucket (a stream too) and a consumer of its own: creating one is several " +
			"replicated stream creations, and every open one adds server state and subscriptions"
		if s.Grouped {
			t.Why = "each key is a consumer of the group's stream and records in its bucket: an Init is three JetStream API " +
				"requests (five for a connection's first key of the group) and N + 2 writes, run 4 at a time here, and every consumer rewrites its state file as keys take turns " +
				"(docs/notes/per-key-costs.md has the profiles)"
		}
		if f := s.PerKey; f != nil {
			t.Why += fmt.Sprintf("; the same keys on plain JetStream in this run: create p50 %s (a consumer, N tokens and a "+
				"record), cycle %s = %.1f× a lone key's %s", fmtDur(f.Create.P50), fmtDur(f.Cycle.P50), f.Ratio(), fmtDur(f.Lone.P50))
			t.Why += "; " + perKeyVerdict("create", createMet, f.Create.P50 <= 2*time.Millisecond) +
				"; " + perKeyVerdict("cycle", cycleMet, f.Ratio() <= 2)
		}
	}
	*ts = append(*ts, t)
}

// perKeyVerdict says, for one half of the many-semaphores target, whether
// natssem met it and whether JetStream alone (the per-key floor) did: a
// half JetStream misses is the broker's limit, one it meets is ours.
func perKeyVerdict(what string, met, floorMet bool) string {
	switch {
	case met:
		return what + " met"
	case floorMet:
		return what + " missed where plain JetStream meets it: the gap is natssem's"
	default:
		return what + " missed, and plain JetStream misses it too: the broker's limit on this store"
	}
}

// addAMQPFloor judges amqpsem's cycle and handoff against the floor of
// RabbitMQ's primitives timed in the same run.
func addAMQPFloor(ts *[]Target, s *SystemResult, p *AMQPPrimitives) {
	var cycle, handoff *Summary
	if s.Cycle != nil {
		cycle = &s.Cycle.Summary
	}
	if s.Handoff != nil {
		handoff = &s.Handoff.Summary
	}
	for _, c := range []struct {
		what  string
		got   *Summary
		floor func(AMQPPrimitives) time.Duration
		bare  Summary // amqpsem's protocol played bare
	}{
		{"cycle", cycle, AMQPPrimitives.CycleFloor, p.protocol().Protocol},
		{"handoff", handoff, AMQPPrimitives.HandoffFloor, p.protocol().ProtocolHandoff},
	} {
		t := Target{System: s.Label, Status: NotRun, Goal: c.what + " p50 ≤ 1.5× its primitives' floor (plain amqp091, same run)"}
		if c.got != nil && p != nil {
			floor := c.floor(*p)
			ratio := float64(c.got.P50) / float64(floor)
			t.Measured = fmt.Sprintf("%s = %.1f× the floor %s", fmtDur(c.got.P50), ratio, fmtDur(floor))
			t.Status = Met
			if ratio > 1.5 {
				t.Status = Missed
				t.Why = "amqpsem's Acquire consumes rather than gets (a basic.get on a quorum queue electing a leader closes " +
					"the whole connection), which adds the consume's round trip and the consumer's cancel, and its Release " +
					"confirms the requeue with a round trip; machine CPU " + pctOf(nil, s.Handoff) + " busy during the handoffs"
				if c.bare.N > 0 {
					t.Why += fmt.Sprintf("; amqpsem's protocol played bare with plain amqp091 in this run: p50 %s = %.1f× the floor",
						fmtDur(c.bare.P50), float64(c.bare.P50)/float64(floor))
				}
			}
		}
		*ts = append(*ts, t)
	}
}

package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/adaptive"
	"github.com/tokensem/tokensem/semmetrics"
)

// adaptable is a semaphore whose count an adaptive controller can move:
// it resizes, and carries its fleet's reports.
type adaptable interface {
	resizer
	SubscribeReports(ctx context.Context, out chan<- adaptive.Report) (stop func(), err error)
}

// runAdapt runs an adaptive controller of a semaphore until interrupted:
// while it holds the leader semaphore's one permit (created if missing), it
// moves the count within --range after the reports of the semaphore's
// holders (adaptive.Publish in each process that uses it). Run it in two
// or more places: one leads, another takes over within the leader's lease
// when it dies, and the count stays meanwhile.
func runAdapt(ctx context.Context, e env, args []string) error {
	fs := flag.NewFlagSet("adapt", flag.ContinueOnError)
	var g globals
	g.register(fs)
	name := fs.String("name", "", "semaphore name")
	rng := fs.String("range", "", "the counts the controller may set, MIN..MAX (1 <= MIN <= MAX)")
	leader := fs.String("leader", "", "the one-permit semaphore whose holder leads, created if missing (default NAME-adapt)")
	lease := fs.Duration("lease", 0, "nats:// only: the leader semaphore's lease when it is created: how soon another controller leads after the leading one dies (default the backend's)")
	window := fs.Duration("window", adaptive.DefaultWindow, "how often the controller decides; the holders should report as often")
	algorithm := fs.String("algorithm", "gradient", "gradient (follows latency) or aimd (follows reported overloads)")
	maxStep := fs.Int("max-step", 0, "change the count by at most K a window (0: no bound)")
	metricsAddr := fs.String("metrics-listen", "", "serve Prometheus metrics at http://ADDR/metrics (the count, the latency it follows, decisions)")
	if err := parse(fs, args, false); err != nil {
		return err
	}
	if err := requireName(*name); err != nil {
		return err
	}
	bounds, err := parseRange(*rng)
	if err != nil {
		return err
	}
	bounds.MaxStep = *maxStep
	if err := bounds.Validate(); err != nil {
		return usageErr{fmt.Errorf("--range %s --max-step %d: %w", *rng, *maxStep, err)}
	}
	if *window <= 0 || *lease < 0 {
		return usageErr{errors.New("--window must be positive and --lease must not be negative")}
	}
	var alg adaptive.Algorithm
	switch *algorithm {
	case "gradient":
		alg = &adaptive.Gradient{}
	case "aimd":
		alg = &adaptive.AIMD{}
	default:
		return usageErr{fmt.Errorf("--algorithm %q: want gradient or aimd", *algorithm)}
	}
	if *leader == "" {
		*leader = *name + "-adapt"
		if len(*leader) > tokensem.MaxNameLen {
			return usageErr{fmt.Errorf("--name %s leaves no room for the default leader name %s (at most %d bytes): name one with --leader", *name, *leader, tokensem.MaxNameLen)}
		}
	}
	if err := tokensem.ValidateName(*leader); err != nil {
		return usageErr{fmt.Errorf("--leader: %w", err)}
	}
	if *leader == *name {
		return usageErr{errors.New("--leader must name another semaphore than --name")}
	}

	s, done, err := openSemaphore(ctx, &g, *name)
	if err != nil {
		return err
	}
	defer done()
	ad, ok := s.(adaptable)
	if !ok {
		return usageErr{errors.New("this backend has no report channel")}
	}
	// The leader: one permit, made if missing; one of another count is a
	// mismatch (two controllers could lead at once), refused.
	leaders, doneLeader, err := openOrInit(ctx, &g, []string{*leader}, 1, *lease)
	if err != nil {
		return fmt.Errorf("the leader semaphore %s: %w", *leader, err)
	}
	defer doneLeader()

	var m *semmetrics.Metrics
	if *metricsAddr != "" {
		reg := newRegistry()
		if m, err = semmetrics.New(reg); err != nil {
			return err
		}
		stopMetrics, err := serveMetrics(ctx, e, *metricsAddr, reg)
		if err != nil {
			return err
		}
		defer stopMetrics()
	}

	reports := make(chan adaptive.Report, 1024)
	stop, err := ad.SubscribeReports(ctx, reports)
	if err != nil {
		return classify(err)
	}
	defer stop()
	// The record seminit status shows, kept in the background.
	var keeper *recordKeeper
	if cr, ok := s.(controlRecorder); ok {
		keeper = newRecordKeeper(cr, adaptive.Record{Leader: *leader, Min: bounds.Min, Max: bounds.Max, Algorithm: *algorithm},
			g.opTimeout(), g.logger())
		kctx, stopKeeper := context.WithCancel(ctx)
		var kept sync.WaitGroup
		kept.Go(func() { keeper.run(kctx) })
		defer func() { stopKeeper(); kept.Wait() }()
	}
	emit := func(v any, text string) {
		if g.json {
			_ = json.NewEncoder(e.stdout).Encode(v)
			return
		}
		fmt.Fprintln(e.stdout, text)
	}
	c := &adaptive.Controller{
		Leader: leaders[0],
		Resize: func(ctx context.Context, n int) error { _, err := ad.Resize(ctx, n); return err },
		Permits: func(ctx context.Context) (int, error) {
			st, err := s.Status(ctx)
			return st.Permits, err
		},
		Reports:   reports,
		Algorithm: alg,
		Bounds:    bounds,
		Window:    *window,
		Logger:    g.logger(),
		Led: func(permits int) {
			if keeper != nil {
				keeper.led(time.Now())
			}
			emit(adaptEvent{Event: "lead", Name: *name, At: time.Now(), Permits: permits, Leader: *leader},
				fmt.Sprintf("%s: leading from %s (leader semaphore %s)", *name, permitCount(permits), *leader))
		},
		Decided: func(d adaptive.Decision) {
			if m != nil {
				m.ObserveDecision(*name, d)
			}
			ev := adaptEvent{Event: "resize", Name: *name, At: d.At, From: d.From, To: d.To, Reports: d.Reports, Holds: d.Sample.Holds,
				Overloaded: d.Sample.Drops, Busy: d.Sample.Busy, LatencyMS: float64(d.Sample.RTT.Microseconds()) / 1000}
			switch {
			case keeper == nil:
			case errors.Is(d.Err, adaptive.ErrNotLeading):
				keeper.lost() // the next leader records itself
			case d.Err != nil || d.To != d.From:
				why := fmt.Sprintf("latency %s, %.1f busy, %d of %d holds overloaded", d.Sample.RTT.Round(100*time.Microsecond),
					d.Sample.Busy, d.Sample.Drops, d.Sample.Holds)
				if d.Err != nil {
					why = fmt.Sprintf("resize to %d failed: %v", d.To, d.Err)
				}
				keeper.changed(adaptive.Change{At: d.At, From: d.From, To: d.Permits, Why: why})
			}
			switch {
			case d.Err != nil:
				ev.Event, ev.Error = "failed", d.Err.Error()
				ev.Permits = d.Permits
				emit(ev, fmt.Sprintf("%s: resize %d → %d failed; the count is %d: %v", *name, d.From, d.To, d.Permits, d.Err))
			case d.To != d.From:
				emit(ev, fmt.Sprintf("%s: %d → %s (latency %s, %.1f permits busy, %d holds, %d overloaded, %d reports)", *name, d.From,
					permitCount(d.To), d.Sample.RTT.Round(100*time.Microsecond), d.Sample.Busy, d.Sample.Holds, d.Sample.Drops, d.Reports))
			}
		},
	}
	if !g.json {
		fmt.Fprintf(e.stdout, "%s: waiting to lead (leader semaphore %s; counts %d..%d, %s, every %v)\n", *name, *leader, bounds.Min, bounds.Max, *algorithm, *window)
	}
	err = c.Run(ctx)
	if ctx.Err() != nil {
		return nil // interrupted: the count stays where it is
	}
	return classify(err)
}

// adaptEvent is one line of seminit adapt --json.
type adaptEvent struct {
	Event      string    `json:"event"` // lead, resize, failed
	Name       string    `json:"name"`
	At         time.Time `json:"at"`
	Leader     string    `json:"leader,omitempty"`
	Permits    int       `json:"permits,omitempty"` // lead: the count it starts from; failed: the count read back
	From       int       `json:"from,omitempty"`
	To         int       `json:"to,omitempty"`
	LatencyMS  float64   `json:"latency_ms,omitempty"`
	Busy       float64   `json:"busy,omitempty"`
	Holds      int       `json:"holds,omitempty"`
	Overloaded int       `json:"overloaded,omitempty"`
	Reports    int       `json:"reports,omitempty"`
	Error      string    `json:"error,omitempty"`
}

// parseRange parses MIN..MAX.
func parseRange(s string) (adaptive.Bounds, error) {
	if s == "" {
		return adaptive.Bounds{}, usageErr{errors.New("--range is required (MIN..MAX, say 2..32)")}
	}
	lo, hi, ok := strings.Cut(s, "..")
	mn, err1 := strconv.Atoi(lo)
	mx, err2 := strconv.Atoi(hi)
	if !ok || err1 != nil || err2 != nil {
		return adaptive.Bounds{}, usageErr{fmt.Errorf("--range %q: want MIN..MAX, say 2..32", s)}
	}
	if mx > tokensem.MaxPermits {
		return adaptive.Bounds{}, usageErr{fmt.Errorf("--range %q: at most %d permits", s, tokensem.MaxPermits)}
	}
	return adaptive.Bounds{Min: mn, Max: mx}, nil
}

// Command bench runs tokensem side by side with a raw core-NATS round trip
// and the classic Redis sorted-set semaphore, on one machine in one run, and
// writes a markdown report (bench.md) and a handoff latency plot
// (handoff.svg).
//
//	cd bench && go run . -out ../docs            # full run
//	cd bench && go run . -quick -out ../docs     # each run short: a few minutes in all
//	cd bench && go run . -systems natssem -scenarios cycle,handoff
//
// natssem runs on an embedded nats-server; amqpsem on the RabbitMQ at
// $RABBITMQ_URL (default amqp://guest:guest@127.0.0.1:5672/); the Redis
// semaphore on a redis-server the harness starts on a random loopback port
// (Debian: apt-get install -y redis-server). A system whose broker is
// missing is skipped with the reason in the report.
package main

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tokensem/tokensem/internal/redact"
)

// config is the harness's flags.
type config struct {
	out             string
	quick           bool
	systems         []string
	scenarios       []string
	amqpURL         string
	natsURL         string
	natsGroup       string
	natsCluster     bool
	redisBin        string
	workers         int
	weightedWorkers int
	priorityWorkers int
	priorityEvery   time.Duration
	layersRTT       time.Duration
	layersGlobal    int
	layersWorkers   [2]int
	adaptiveCaps    []int
	adaptiveFixed   []int
	adaptivePhase   time.Duration
	adaptiveWorkers int
	adaptiveService time.Duration
	adaptiveWindow  time.Duration
	permits         int
	hold            time.Duration
	duration        time.Duration
	sems            int
	amqpSems        int
	waiters         int
	amqpWaits       int
	bigN            int
	cpuProfile      string
	timeout         time.Duration
	sleepHold       bool
	idle            time.Duration
	args            []string
}

var allSystems = []string{"natssem", "amqpsem", "redis", "redis-fast"}
var allScenarios = []string{"cycle", "contention", "weighted", "priority", "layers", "adaptive", "handoff", "sems", "waiters", "bign"}

func parseFlags(args []string, stderr io.Writer) (*config, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &config{args: args}
	systems := fs.String("systems", strings.Join(allSystems, ","),
		"systems to run, comma-separated: natssem (with the raw core-NATS round trip), amqpsem, redis (retry 50–200 ms), redis-fast (retry 1–5 ms)")
	scenarios := fs.String("scenarios", strings.Join(allScenarios, ","),
		"scenarios to run, comma-separated: cycle, contention, weighted (mixed weights 1-3, tokensem only), priority (classes, and FIFO beside), layers (a regional limit under a distant global one: exact and block modes, tokensem only), adaptive (a controller moves N after a downstream whose capacity changes, beside fixed N; tokensem only), handoff, sems (many semaphores), waiters (thousands of waiters + memory), bign (N=10,000)")
	fs.StringVar(&c.out, "out", "", "directory to write bench.md and handoff.svg to (default: print the markdown only)")
	fs.BoolVar(&c.quick, "quick", false, "short runs (fewer samples, 3 s of contention): the whole run takes a few minutes")
	fs.StringVar(&c.amqpURL, "amqp-url", cmp.Or(os.Getenv("RABBITMQ_URL"), "amqp://guest:guest@127.0.0.1:5672/"), "RabbitMQ URL (default $RABBITMQ_URL)")
	fs.StringVar(&c.natsURL, "nats-url", "", "run natssem on this NATS server (with JetStream) instead of an embedded one")
	fs.BoolVar(&c.natsCluster, "nats-cluster", false, "run natssem on a 3-node NATS cluster embedded in the harness (R3 streams and buckets, clients spread over the nodes)")
	fs.StringVar(&c.natsGroup, "nats-group", "", "make every natssem semaphore a key of this group (natssem.WithGroup: one stream and bucket for all)")
	fs.StringVar(&c.redisBin, "redis-server", "", "redis-server binary (default: redis-server on PATH)")
	fs.IntVar(&c.workers, "workers", 32, "contention: workers, each on a connection of its own")
	fs.IntVar(&c.weightedWorkers, "weighted-workers", 12, "weighted: workers of weights 1, 2 and 3 in turn (weight 3 needs -permits of at least 3)")
	fs.IntVar(&c.priorityWorkers, "priority-workers", 16, "priority: low-class workers keeping the permits busy")
	fs.DurationVar(&c.priorityEvery, "priority-every", 20*time.Millisecond, "priority: how often a high-class caller arrives")
	fs.DurationVar(&c.layersRTT, "layers-rtt", 20*time.Millisecond, "layers: round trip the proxy adds to the global broker")
	fs.IntVar(&c.layersGlobal, "layers-global", 8, "layers: the global limit the two regions contend for")
	layersWorkers := fs.String("layers-workers", "12,4", "layers: workers of the two regions, comma-separated")
	adaptiveCaps := fs.String("adaptive-caps", "12,6,16", "adaptive: the downstream's capacity in each phase, comma-separated")
	adaptiveFixed := fs.String("adaptive-fixed", "4,12,32", "adaptive: fixed counts run beside, comma-separated")
	fs.DurationVar(&c.adaptivePhase, "adaptive-phase", 0, "adaptive: how long each capacity lasts (default 30s, 20s with -quick)")
	fs.IntVar(&c.adaptiveWorkers, "adaptive-workers", 32, "adaptive: workers, over 4 processes")
	fs.DurationVar(&c.adaptiveService, "adaptive-service", 50*time.Millisecond, "adaptive: the downstream's service time per use")
	fs.DurationVar(&c.adaptiveWindow, "adaptive-window", time.Second, "adaptive: the controller's window")
	fs.IntVar(&c.permits, "permits", 4, "contention and waiters: permits N")
	fs.DurationVar(&c.hold, "hold", time.Millisecond, "contention and waiters: how long each acquisition holds")
	fs.DurationVar(&c.duration, "duration", 0, "contention: how long to run (default 10s, 3s with -quick)")
	fs.IntVar(&c.sems, "sems", 1000, "sems: semaphores on one broker")
	fs.IntVar(&c.amqpSems, "amqp-sems", 1000, "sems: bound for RabbitMQ (each semaphore is a quorum queue)")
	fs.IntVar(&c.waiters, "waiters", 5000, "waiters: callers blocked on one semaphore")
	fs.IntVar(&c.amqpWaits, "amqp-waiters", 5000, "waiters: bound for RabbitMQ (each waiter is a channel and a consumer)")
	fs.IntVar(&c.bigN, "bign", 10000, "bign: permits of the large semaphore")
	fs.DurationVar(&c.idle, "handoff-idle", time.Millisecond, "handoff: how long the waiter has been waiting (counted by the broker) when the holder releases")
	fs.BoolVar(&c.sleepHold, "sleep-hold", false, "hold with time.Sleep instead of a nanosleep system call (the Go timer fires late when the CPUs are busy)")
	fs.StringVar(&c.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file (go tool pprof)")
	fs.DurationVar(&c.timeout, "timeout", 45*time.Minute, "give up on the whole run after this long")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	var err error
	if c.systems, err = pickList(*systems, allSystems, "system"); err != nil {
		return nil, err
	}
	if c.scenarios, err = pickList(*scenarios, allScenarios, "scenario"); err != nil {
		return nil, err
	}
	if c.duration == 0 {
		c.duration = 10 * time.Second
		if c.quick {
			c.duration = 3 * time.Second
		}
	}
	if c.idle < 0 {
		return nil, errors.New("-handoff-idle must not be negative")
	}
	if _, err := fmt.Sscanf(*layersWorkers, "%d,%d", &c.layersWorkers[0], &c.layersWorkers[1]); err != nil ||
		c.layersWorkers[0] < 1 || c.layersWorkers[1] < 1 {
		return nil, fmt.Errorf("-layers-workers %q: want two positive counts, as 12,4", *layersWorkers)
	}
	for _, l := range []struct {
		flag, s string
		into    *[]int
	}{{"-adaptive-caps", *adaptiveCaps, &c.adaptiveCaps}, {"-adaptive-fixed", *adaptiveFixed, &c.adaptiveFixed}} {
		for f := range strings.SplitSeq(l.s, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 {
				return nil, fmt.Errorf("%s %q: want positive counts, comma-separated", l.flag, l.s)
			}
			*l.into = append(*l.into, n)
		}
	}
	if c.adaptivePhase == 0 {
		c.adaptivePhase = 30 * time.Second
		if c.quick {
			c.adaptivePhase = 20 * time.Second
		}
	}
	if c.adaptivePhase <= adaptiveSettle || c.adaptiveWorkers < 4 || c.adaptiveService <= 0 || c.adaptiveWindow <= 0 {
		return nil, fmt.Errorf("-adaptive-phase must be longer than %v, -adaptive-workers at least 4, -adaptive-service and -adaptive-window positive", adaptiveSettle)
	}
	if c.layersRTT < 0 || c.layersGlobal < 1 {
		return nil, errors.New("-layers-rtt must not be negative and -layers-global must be positive")
	}
	if c.natsCluster && c.natsURL != "" {
		return nil, errors.New("-nats-cluster starts a cluster of its own: it cannot go with -nats-url")
	}
	if c.workers < 1 || c.weightedWorkers < 1 || c.priorityWorkers < 1 || c.priorityEvery <= 0 || c.permits < 1 || c.hold <= 0 || c.duration <= 0 || c.sems < 1 || c.waiters < 1 || c.bigN < 1 ||
		c.amqpSems < 1 || c.amqpWaits < 1 {
		return nil, errors.New("-workers, -weighted-workers, -permits, -hold, -duration, -sems, -waiters and -bign must be positive")
	}
	return c, nil
}

// pickList parses a comma-separated subset of known, keeping known's order.
func pickList(s string, known []string, what string) ([]string, error) {
	var got []string
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if f == "all" {
			return known, nil
		}
		if !slices.Contains(known, f) {
			return nil, fmt.Errorf("unknown %s %q (want some of %s)", what, f, strings.Join(known, ","))
		}
		got = append(got, f)
	}
	if len(got) == 0 {
		return nil, fmt.Errorf("no %s selected", what)
	}
	var out []string
	for _, k := range known {
		if slices.Contains(got, k) {
			out = append(out, k)
		}
	}
	return out, nil
}

func (c *config) has(scenario string) bool { return slices.Contains(c.scenarios, scenario) }

// command is the command line that reproduces this run.
func (c *config) command() string {
	parts := []string{"cd bench && go run ."}
	for _, a := range c.args {
		if strings.ContainsAny(a, " \t'\"$") {
			a = strconv.Quote(a)
		}
		parts = append(parts, a)
	}
	return strings.Join(parts, " ")
}

// samples per scenario: quick and full profiles.
type profile struct {
	cycle, cycleAMQP     int
	handoff, handoffAMQP int
	handoffRedisSlow     int
	rtt, rttIdle, prims  int
	statuses             int
	layers               int
	serveLimit           time.Duration
	semsConcurrency      int
}

func (c *config) profile() profile {
	if c.quick {
		return profile{cycle: 2000, cycleAMQP: 500, handoff: 300, handoffAMQP: 200, handoffRedisSlow: 60,
			rtt: 2000, rttIdle: 300, prims: 500, statuses: 3, layers: 100, serveLimit: 30 * time.Second, semsConcurrency: 4}
	}
	return profile{cycle: 10000, cycleAMQP: 2000, handoff: 1000, handoffAMQP: 500, handoffRedisSlow: 200,
		rtt: 10000, rttIdle: 1000, prims: 2000, statuses: 5, layers: 300, serveLimit: 2 * time.Minute, semsConcurrency: 4}
}

func main() {
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(64)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	if cfg.cpuProfile != "" {
		f, err := os.Create(cfg.cpuProfile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		defer func() { pprof.StopCPUProfile(); _ = f.Close() }()
	}
	rep := run(ctx, cfg, os.Stderr)
	if err := emit(cfg, rep, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// emit writes the markdown (to stdout, and with -out to DIR/bench.md) and,
// with -out, the plot (DIR/handoff.svg) when the handoff scenario ran.
func emit(cfg *config, rep *Report, stdout io.Writer) error {
	if cfg.out == "" {
		return WriteMarkdown(stdout, rep, "")
	}
	return writeReport(cfg.out, rep, stdout)
}

// writeReport writes bench.md into dir (and to stdout) and handoff.svg
// beside it when the report has handoff samples to plot; bench.md refers
// to the picture only then.
func writeReport(dir string, rep *Report, stdout io.Writer) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	plot := ""
	if series := handoffSeries(rep); len(series) > 0 {
		plot = "handoff.svg"
		if err := writeFile(filepath.Join(dir, plot), func(w io.Writer) error {
			return WriteCDF(w, handoffTitle(rep), series, handoffMarks())
		}); err != nil {
			return err
		}
	}
	if name := adaptivePlotName(rep); name != "" {
		series, end := adaptiveSeries(rep)
		if err := writeFile(filepath.Join(dir, name), func(w io.Writer) error {
			return WriteSteps(w, "Adaptive limits: the permit count as the downstream's capacity changes", "permits", series, end)
		}); err != nil {
			return err
		}
	}
	mdPath := filepath.Join(dir, "bench.md")
	if err := writeFile(mdPath, func(w io.Writer) error {
		return WriteMarkdown(io.MultiWriter(w, stdout), rep, plot)
	}); err != nil {
		return err
	}
	if plot != "" {
		fmt.Fprintf(os.Stderr, "wrote %s and %s\n", mdPath, filepath.Join(dir, plot))
	} else {
		fmt.Fprintf(os.Stderr, "wrote %s (no handoff plot: the handoff scenario did not run)\n", mdPath)
	}
	return nil
}

// writeFile creates path and writes it with write, buffered.
func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	if err := write(w); err != nil {
		_ = f.Close()
		return err
	}
	if err := w.Flush(); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// run runs every selected system and scenario and gathers the report.
func run(ctx context.Context, cfg *config, log io.Writer) *Report {
	p := cfg.profile()
	rep := &Report{Command: cfg.command(), Quick: cfg.quick, Started: time.Now(), Machine: machine(),
		Workers: cfg.workers, Permits: cfg.permits, Hold: cfg.hold, Idle: cfg.idle}
	rep.Machine.LoadStart = loadAvg()
	cpu := startCPU()
	logf := func(format string, a ...any) {
		fmt.Fprintf(log, "%7.1fs  %s\n", time.Since(rep.Started).Seconds(), fmt.Sprintf(format, a...))
	}
	logf("load average at start: %s (%d CPUs); profile %s", rep.Machine.LoadStart, rep.Machine.CPUs, map[bool]string{true: "quick", false: "full"}[cfg.quick])
	runID := strconv.FormatInt(time.Now().Unix()%100000, 10)

	var redisSrv *RedisServer
	defer func() {
		if redisSrv != nil {
			redisSrv.Stop()
		}
	}()
	for _, key := range cfg.systems {
		if ctx.Err() != nil {
			break
		}
		res := &SystemResult{Key: key, Errs: map[string]string{}}
		rep.Systems = append(rep.Systems, res)
		var sys System
		switch key {
		case "natssem":
			res.Label, res.Tokensem = "natssem", true
			ns, err := startNATS(ctx, cfg.natsURL, cfg.natsGroup, cfg.natsCluster)
			if err != nil {
				res.Skipped = "NATS: " + err.Error()
				break
			}
			if cfg.natsGroup != "" {
				res.Label, res.Grouped = "natssem (group "+cfg.natsGroup+")", true
			}
			rep.Machine.NATS = ns.Version()
			rep.Machine.NATSURL = cfg.natsURL
			rep.Machine.NATSGroup = cfg.natsGroup
			rep.Machine.NATSReplicas = ns.replicas
			logf("nats-server %s at %s (embedded: %v, replicas %d)", ns.Version(), ns.url, ns.srv != nil || ns.cluster != nil, max(ns.replicas, 1))
			if d, err := ns.rawRTT(ctx, p.rtt, 0); err != nil {
				rep.RawErr = err.Error()
			} else {
				s := Summarize(d)
				rep.RawRTT = &s
				logf("raw core-NATS request-reply: p50 %s p99 %s", fmtDur(s.P50), fmtDur(s.P99))
			}
			if cfg.has("handoff") && cfg.idle > 0 {
				if d, err := ns.rawRTT(ctx, p.rttIdle, cfg.idle); err == nil {
					s := Summarize(d)
					rep.RawIdle = &s
					logf("raw core-NATS request-reply after %s idle: p50 %s p99 %s", fmtDur(cfg.idle), fmtDur(s.P50), fmtDur(s.P99))
				}
			}
			if cfg.has("cycle") {
				if pr, err := ns.primitives(ctx, p.prims); err != nil {
					logf("primitives: %v", err)
				} else {
					rep.Prims = &pr
					logf("primitives: KV CAS p50 %s, Nak+pull p50 %s", fmtDur(pr.CAS.P50), fmtDur(pr.NakPull.P50))
				}
			}
			sys = ns
		case "amqpsem":
			res.Label, res.Tokensem = "amqpsem", true
			as, err := startAMQP(ctx, cfg.amqpURL)
			if err != nil {
				res.Skipped = fmt.Sprintf("RabbitMQ at %s unreachable (%v): set RABBITMQ_URL, or start Debian's broker with `bash .ci/rabbitmq.sh`", redact.URL(cfg.amqpURL), err)
				break
			}
			if cfg.has("cycle") || cfg.has("handoff") || cfg.has("priority") {
				if pr, err := as.primitives(ctx, p.prims); err != nil {
					logf("RabbitMQ primitives: %v", err)
				} else {
					rep.AMQPPrims = &pr
					logf("RabbitMQ primitives: requeue+get p50 %s, push p50 %s, claim p50 %s", fmtDur(pr.GetRequeue.P50),
						fmtDur(pr.Push.P50), fmtDur(pr.Claim.P50))
				}
			}
			rep.Machine.RabbitMQ = as.Version()
			rep.Machine.RabbitURL = redact.URL(cfg.amqpURL)
			logf("RabbitMQ %s at %s", as.Version(), redact.URL(cfg.amqpURL))
			sys = as
		case "redis", "redis-fast":
			jmin, jmax := 50*time.Millisecond, 200*time.Millisecond
			if key == "redis-fast" {
				jmin, jmax = time.Millisecond, 5*time.Millisecond
			}
			res.Label = "redis zset, retry " + jitterLabel(jmin, jmax)
			res.Jitter = jmax
			if redisSrv == nil {
				srv, err := StartRedis(ctx, cfg.redisBin)
				if err != nil {
					res.Skipped = err.Error()
					logf("%s: skipped: %v", key, err)
					break
				}
				redisSrv = srv
				rep.Machine.Redis = srv.Version
				logf("redis-server %s started at %s", srv.Version, srv.Addr)
			}
			sys = newRedisSystem(redisSrv, key, jmin, jmax)
		}
		if sys == nil {
			if res.Skipped != "" {
				logf("%s: skipped: %s", key, res.Skipped)
			}
			continue
		}
		runSystem(ctx, cfg, p, sys, res, runID, logf)
		sys.Close()
	}
	rep.Elapsed = time.Since(rep.Started)
	rep.Machine.LoadEnd = loadAvg()
	rep.CPU = cpu.Stop()
	logf("load average at end: %s; machine CPU %.0f%% busy over the run, this harness %.2f cores", rep.Machine.LoadEnd,
		100*rep.CPU.MachineBusy, rep.CPU.HarnessCores)
	return rep
}

// runSystem runs the selected scenarios on one system; a failed scenario
// is recorded and the next one runs.
func runSystem(ctx context.Context, cfg *config, p profile, sys System, res *SystemResult, runID string,
	logf func(string, ...any)) {
	key := sys.Key()
	name := func(s string) string { return "bench-" + runID + "-" + key + "-" + s }
	fail := func(scenario string, err error) {
		res.Errs[scenario] = err.Error()
		logf("%s %s: FAILED: %v", key, scenario, err)
	}
	isAMQP := key == "amqpsem"
	slowRedis := key == "redis"
	if cfg.has("cycle") {
		n := p.cycle
		if isAMQP {
			n = p.cycleAMQP
		}
		if r, err := runCycle(ctx, sys, name("cycle"), n); err != nil {
			fail("cycle", err)
		} else {
			res.Cycle = r
			logf("%s cycle: p50 %s p99 %s (n=%d); machine CPU %.0f%% busy", key, fmtDur(r.P50), fmtDur(r.P99), r.N, 100*r.CPU.MachineBusy)
		}
	}
	if cfg.has("contention") {
		if r, err := runContention(ctx, sys, name("contention"), cfg.workers, cfg.permits, cfg.hold, cfg.duration, !cfg.sleepHold); err != nil {
			fail("contention", err)
		} else {
			res.Contention = r
			logf("%s contention: %.0f/s (%.0f%% of %.0f/s), wait p50 %s p99 %s, max/min %.2f CV %.3f, peak holders %d; mean hold %s, release p50 %s p99 %s, slot idle p50 %s mean %s; machine CPU %.0f%% busy, harness %.2f cores",
				key, r.Throughput, r.Percent(), r.Ceiling, fmtDur(r.Wait.P50), fmtDur(r.Wait.P99), r.Fair.MaxMin, r.Fair.CV, r.Peak,
				fmtDur(r.MeanHold), fmtDur(r.Release.P50), fmtDur(r.Release.P99), fmtDur(r.Gap.P50), fmtDur(r.Gap.Mean), 100*r.CPU.MachineBusy, r.CPU.HarnessCores)
		}
		if as, ok := sys.(*amqpSystem); ok {
			if r, err := as.protocolContention(ctx, cfg.workers, cfg.permits, cfg.hold, cfg.duration, !cfg.sleepHold); err != nil {
				logf("RabbitMQ protocol contention: %v", err)
			} else {
				res.AMQPProtocol = r
				logf("RabbitMQ protocol contention (plain amqp091, amqpsem's broker operations): %.0f/s (%.0f%% of %.0f/s), mean hold %s",
					r.Throughput, r.Percent(), r.Ceiling, fmtDur(r.MeanHold))
			}
		}
	}
	if cfg.has("weighted") && res.Tokensem {
		if r, err := runWeighted(ctx, sys, name("weighted"), cfg.weightedWorkers, cfg.permits, cfg.hold, cfg.duration, !cfg.sleepHold); err != nil {
			fail("weighted", err)
		} else {
			res.Weighted = r
			logf("%s weighted: %.0f permits/s (%.0f%% of %.0f/s), most weight inside %d of %d; machine CPU %.0f%% busy",
				key, r.Units, r.Percent(), r.Ceiling, r.Peak, r.N, 100*r.CPU.MachineBusy)
		}
	}
	if cfg.has("priority") {
		runs := []bool{false} // FIFO, for every system
		if res.Tokensem {
			runs = append(runs, true)
		}
		for _, classes := range runs {
			r, err := runPriority(ctx, sys, name("priority"), cfg.priorityWorkers, cfg.permits, cfg.hold, cfg.priorityEvery, cfg.duration, classes, !cfg.sleepHold)
			if err != nil {
				fail("priority", err)
				break
			}
			if classes {
				res.Priority = r
			} else {
				res.PriorityFIFO = r
			}
			logf("%s priority (classes %v): caller wait p50 %s p99 %s (%d calls), workers' wait p50 %s p99 %s, %.0f/s, peak holders %d; machine CPU %.0f%% busy",
				key, classes, fmtDur(r.High.P50), fmtDur(r.High.P99), r.HighAcquired, fmtDur(r.Low.P50), fmtDur(r.Low.P99), r.LowThroughput, r.Peak, 100*r.CPU.MachineBusy)
		}
	}
	if cfg.has("layers") && res.Tokensem {
		if r, err := runLayers(ctx, sys, name("layers"), cfg.layersRTT, p.layers, cfg.layersGlobal, cfg.layersWorkers, cfg.hold, cfg.duration, !cfg.sleepHold); err != nil {
			fail("layers", err)
		} else {
			res.Layers = r
			logf("%s layers: acquire p50 regional alone %s, exact %s, block %s; holds by region %d/%d (workers %d/%d), peak %d of %d",
				key, fmtDur(r.Plain.P50), fmtDur(r.Exact.P50), fmtDur(r.Block.P50), r.Regions[0].Holds, r.Regions[1].Holds,
				r.Regions[0].Workers, r.Regions[1].Workers, r.Peak, r.Global)
		}
	}
	if cfg.has("adaptive") && res.Tokensem {
		type mode struct {
			fixed int
			right bool
		}
		modes := []mode{{0, false}, {0, true}}
		for _, n := range cfg.adaptiveFixed {
			modes = append(modes, mode{fixed: n})
		}
		for _, m := range modes {
			r, err := runAdaptive(ctx, sys, name("adaptive"), cfg.adaptiveCaps, cfg.adaptivePhase, 4, cfg.adaptiveWorkers, 4, m.fixed, m.right,
				cfg.adaptiveService, cfg.adaptiveWindow, !cfg.sleepHold)
			if err != nil {
				fail("adaptive", err)
				break
			}
			res.Adaptive = append(res.Adaptive, r)
			var b strings.Builder
			for _, ph := range r.Phases {
				fmt.Fprintf(&b, " | C=%d: %.0f/s, latency p50 %s p99 %s, settled %s", ph.C, ph.Throughput, fmtDur(ph.Latency.P50), fmtDur(ph.Latency.P99), fmtDur(ph.Settled))
			}
			logf("%s adaptive, %s: counts %v, peak holders %d (most set %d), %d decisions, %d failed%s; %v",
				key, r.label(), r.Counts, r.Peak, r.MostSet, r.Decisions, r.Failed, b.String(), r.Errs)
		}
	}
	if cfg.has("handoff") {
		n, settle := p.handoff, time.Duration(0)
		switch {
		case isAMQP:
			n = p.handoffAMQP
		case slowRedis:
			n = p.handoffRedisSlow
		}
		if rs, ok := sys.(*redisSystem); ok {
			settle = rs.jmax
		}
		if r, err := runHandoff(ctx, sys, name("handoff"), n, cfg.idle, settle); err != nil {
			fail("handoff", err)
		} else {
			res.Handoff = r
			logf("%s handoff: p50 %s p99 %s (n=%d); machine CPU %.0f%% busy", key, fmtDur(r.P50), fmtDur(r.P99), r.N, 100*r.CPU.MachineBusy)
		}
		if res.Tokensem && cfg.idle > 0 {
			if r, err := runHandoff(ctx, sys, name("handoff-hot"), n, 0, 0); err != nil {
				logf("%s handoff to a running waiter: %v", key, err)
			} else {
				res.HandoffHot = r
				logf("%s handoff to a waiter released at once: p50 %s p99 %s (n=%d)", key, fmtDur(r.P50), fmtDur(r.P99), r.N)
			}
		}
	}
	if cfg.has("sems") {
		count := cfg.sems
		if isAMQP && cfg.amqpSems < count {
			count = cfg.amqpSems
			res.Bounds = append(res.Bounds, fmt.Sprintf("semaphores bounded to %d (-amqp-sems)", count))
		}
		if r, err := runManySems(ctx, sys, name("s"), count, cfg.permits, p.semsConcurrency); err != nil {
			fail("sems", err)
		} else {
			res.Sems = r
			logf("%s %d semaphores: created in %s (p50 %s each), first cycle p50 %s, next cycle p50 %s p99 %s", key, r.Count,
				fmtDur(r.InitTotal), fmtDur(r.Init.P50), fmtDur(r.First.P50), fmtDur(r.Cycle.P50), fmtDur(r.Cycle.P99))
			if ns, ok := sys.(*natsSystem); ok && ns.group != "" {
				if f, err := ns.perKeyFloor(ctx, r.Count, cfg.permits, p.prims, p.semsConcurrency); err != nil {
					logf("per-key floor: %v", err)
				} else {
					res.PerKey = f
					logf("plain JetStream, %d keys: create p50 %s; cycle p50 %s, lone %s (%.1f×)", f.Count, fmtDur(f.Create.P50),
						fmtDur(f.Cycle.P50), fmtDur(f.Lone.P50), f.Ratio())
				}
			}
		}
	}
	if cfg.has("waiters") {
		w := cfg.waiters
		if isAMQP && cfg.amqpWaits < w {
			w = cfg.amqpWaits
			res.Bounds = append(res.Bounds, fmt.Sprintf("waiters bounded to %d (-amqp-waiters)", w))
		}
		r, err := runWaiters(ctx, sys, name("waiters"), w, cfg.permits, cfg.hold, p.serveLimit, !cfg.sleepHold)
		if r != nil {
			res.Waiters = r
		}
		if err != nil {
			fail("waiters", err)
		}
		if r != nil {
			logf("%s %d waiters: all waiting after %s; served %d in %s (ideal %s); peak holders %d; heap %s + stack %s per waiter",
				key, r.Waiters, fmtDur(r.QueuedIn), r.Served, fmtDur(r.ServedIn), fmtDur(r.Ideal), r.Peak,
				fmtBytes(r.HeapPerWaiter), fmtBytes(r.StackPerWaiter))
		}
	}
	if cfg.has("bign") {
		r, err := runBigN(ctx, sys, name("bign"), cfg.bigN, p.statuses)
		if r != nil {
			res.BigN = r
		}
		if err != nil {
			fail("bign", err)
		} else {
			logf("%s N=%d: init %s, first cycle %s, next cycles p50 %s, census p50 %s, cycle after the census %s", key, r.N,
				fmtDur(r.Init), fmtDur(r.First), fmtDur(r.Cycle.P50), fmtDur(r.Status.P50), fmtDur(r.AfterCensus))
		}
	}
	if ns, ok := sys.(*natsSystem); ok {
		// Last, so that natssem's own figures are taken on the same
		// server state as before these runs were added.
		ns.playProtocols(ctx, cfg, p.handoff, res, logf)
	}
}

// machine describes this machine.
func machine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				f := strings.Fields(v)
				if kb, err := strconv.ParseFloat(f[0], 64); err == nil {
					m.Memory = fmtBytes(kb * 1024)
				}
			}
		}
	}
	return m
}

// loadAvg returns the 1, 5 and 15 minute load averages.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

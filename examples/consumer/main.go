package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem/natssem"
	"github.com/tokensem/tokensem/natssem/embedded"
)

// Names of the demo's resources. The semaphore keeps its tokens in a stream
// of its own (natssem.ResourcesOf(semName, "").Stream); the jobs live in jobStream.
const (
	semName     = "consumer-demo"
	jobStream   = "DEMO_JOBS"
	jobSubject  = "demo.jobs"
	jobConsumer = "workers"
)

// config is the command line.
type config struct {
	url     string // NATS server; empty: start an embedded one
	permits int
	workers int
	jobs    int
	work    time.Duration
}

func defaultConfig() config {
	return config{permits: 3, workers: 8, jobs: 40, work: 30 * time.Millisecond}
}

func main() {
	cfg := defaultConfig()
	flag.StringVar(&cfg.url, "url", "", "NATS server URL (default: start an embedded server)")
	flag.IntVar(&cfg.permits, "permits", cfg.permits, "jobs in processing at once, across all workers")
	flag.IntVar(&cfg.workers, "workers", cfg.workers, "number of workers")
	flag.IntVar(&cfg.jobs, "jobs", cfg.jobs, "number of jobs to publish")
	flag.DurationVar(&cfg.work, "work", cfg.work, "time to process one job")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if _, err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		os.Exit(1)
	}
}

// report is what the run saw.
type report struct {
	Jobs       int   // published
	Processed  int   // acknowledged, counting repeats
	Duplicates int   // jobs processed more than once
	Missing    int   // jobs never processed
	Redone     int   // jobs handed back after a lost permit
	MaxActive  int   // most jobs in processing at once
	PerWorker  []int // jobs acknowledged by each worker
	Left       uint64
	Available  int // permits available after the run
}

// tally is the workers' shared record.
type tally struct {
	mu        sync.Mutex
	done      map[string]int // job -> times acknowledged
	perWorker []int
	active    int
	maxActive int
	redone    int
	remaining int
}

func (t *tally) enter() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.active++
	t.maxActive = max(t.maxActive, t.active)
}

func (t *tally) leave() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.active--
}

func (t *tally) acked(worker int, job string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.done[job]++
	t.perWorker[worker]++
	t.remaining--
}

func (t *tally) left() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.remaining
}

func run(ctx context.Context, cfg config, out io.Writer) (report, error) {
	if cfg.permits < 1 || cfg.workers < 1 || cfg.jobs < 0 {
		return report{}, errors.New("need at least 1 permit and 1 worker")
	}
	url, where, stopServer, err := server(cfg.url)
	if err != nil {
		return report{}, err
	}
	defer stopServer()
	nc, err := nats.Connect(url)
	if err != nil {
		return report{}, err
	}
	defer nc.Close()

	sem, err := natssem.Init(ctx, nc, semName, cfg.permits)
	if err != nil {
		return report{}, err
	}
	defer sem.Close()
	stream, err := publishJobs(ctx, nc, cfg.jobs)
	if err != nil {
		return report{}, err
	}
	fmt.Fprintf(out, "%s; semaphore %q: %d permits (tokens in stream %s)\n", where, semName, cfg.permits, natssem.ResourcesOf(semName, "").Stream)
	fmt.Fprintf(out, "job stream %s: %d jobs; %d workers, each: acquire a permit, then fetch 1 job, process %v, ack, release\n\n",
		jobStream, cfg.jobs, cfg.workers, cfg.work)

	t := &tally{done: map[string]int{}, perWorker: make([]int, cfg.workers), remaining: cfg.jobs}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, cfg.workers)
	var wg sync.WaitGroup
	for w := range cfg.workers {
		wg.Go(func() {
			if err := worker(wctx, url, w, cfg.work, t); err != nil {
				errs <- fmt.Errorf("worker %d: %w", w, err)
				cancel()
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := errors.Join(drain(errs)...); err != nil {
		return report{}, err
	}
	if err := ctx.Err(); err != nil {
		return report{}, err
	}
	return summarize(ctx, cfg, sem, stream, t, out)
}

func drain(errs <-chan error) []error {
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	return all
}

// server returns the URL of the NATS server to use, starting an embedded
// one when url is empty.
func server(url string) (string, string, func(), error) {
	if url != "" {
		return url, "NATS at " + url, func() {}, nil
	}
	srv, err := embedded.Start(embedded.Config{})
	if err != nil {
		return "", "", nil, err
	}
	return srv.URL(), "embedded NATS at " + srv.URL(), srv.Shutdown, nil
}

// publishJobs creates (or empties) the work stream and its consumer, and
// publishes n jobs.
func publishJobs(ctx context.Context, nc *nats.Conn, n int) (jetstream.Stream, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	stream, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:      jobStream,
		Subjects:  []string{jobSubject},
		Retention: jetstream.WorkQueuePolicy, // an acknowledged job is gone
		Storage:   jetstream.FileStorage,
	})
	if err != nil {
		return nil, err
	}
	if err := stream.Purge(ctx); err != nil {
		return nil, err
	}
	if _, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:   jobConsumer,
		AckPolicy: jetstream.AckExplicitPolicy,
		AckWait:   30 * time.Second,
	}); err != nil {
		return nil, err
	}
	for i := range n {
		if _, err := js.Publish(ctx, jobSubject, fmt.Appendf(nil, "job-%03d", i)); err != nil {
			return nil, err
		}
	}
	return stream, nil
}

// worker is one consumer process: its own connection, its own handle on
// the semaphore and on the job consumer. It takes a permit before it pulls
// a job, so it never holds a job it has no capacity for.
func worker(ctx context.Context, url string, id int, work time.Duration, t *tally) error {
	nc, err := nats.Connect(url)
	if err != nil {
		return err
	}
	defer nc.Close()
	sem, err := natssem.Open(ctx, nc, semName)
	if err != nil {
		return err
	}
	defer sem.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	jobs, err := js.Consumer(ctx, jobStream, jobConsumer)
	if err != nil {
		return err
	}
	for t.left() > 0 {
		p, err := sem.Acquire(ctx)
		if err != nil {
			return ignoreCancel(ctx, err)
		}
		msg, err := fetchOne(jobs)
		if err != nil || msg == nil {
			// No job right now (the rest are in other workers' hands):
			// give the permit back and look again.
			_ = p.Release(context.WithoutCancel(ctx))
			if err != nil {
				return err
			}
			continue
		}

		t.enter()
		timer := time.NewTimer(work) // the job's work
		lost := false
		select {
		case <-timer.C:
		case <-p.Done(): // the permit is gone: stop working at once
			lost = true
		case <-ctx.Done():
		}
		timer.Stop()
		t.leave()

		switch {
		case lost || ctx.Err() != nil:
			// Hand the job back for another worker.
			_ = msg.Nak()
			t.mu.Lock()
			t.redone++
			t.mu.Unlock()
		default:
			// A confirmed ack: once it returns, the job is gone from the stream.
			if err := msg.DoubleAck(ctx); err != nil {
				_ = p.Release(context.WithoutCancel(ctx))
				return ignoreCancel(ctx, fmt.Errorf("ack %s: %w", msg.Data(), err))
			}
			t.acked(id, string(msg.Data()))
		}
		_ = p.Release(context.WithoutCancel(ctx)) // reports a loss; nothing to do about it here
	}
	return nil
}

// fetchOne pulls at most one job, waiting briefly; nil when none came.
func fetchOne(jobs jetstream.Consumer) (jetstream.Msg, error) {
	batch, err := jobs.Fetch(1, jetstream.FetchMaxWait(250*time.Millisecond))
	if err != nil {
		return nil, err
	}
	var got jetstream.Msg
	for m := range batch.Messages() {
		got = m
	}
	if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
		return got, err
	}
	return got, nil
}

func ignoreCancel(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// summarize prints the report and checks: every job processed exactly
// once, none left in the stream, never more than permits in processing,
// every permit back.
func summarize(ctx context.Context, cfg config, sem *natssem.Semaphore, stream jetstream.Stream, t *tally, out io.Writer) (report, error) {
	info, err := stream.Info(ctx)
	if err != nil {
		return report{}, err
	}
	available, err := settle(ctx, sem, cfg.permits)
	if err != nil {
		return report{}, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	rep := report{
		Jobs: cfg.jobs, MaxActive: t.maxActive, Redone: t.redone,
		PerWorker: append([]int(nil), t.perWorker...), Left: info.State.Msgs, Available: available,
	}
	for i := range cfg.jobs {
		switch n := t.done[fmt.Sprintf("job-%03d", i)]; {
		case n == 0:
			rep.Missing++
		case n > 1:
			rep.Duplicates++
		}
	}
	for _, n := range t.done {
		rep.Processed += n
	}
	for w, n := range rep.PerWorker {
		fmt.Fprintf(out, "worker %d: %d jobs\n", w, n)
	}
	fmt.Fprintf(out, "\n%d jobs processed for %d published: %d twice or more, %d never; %d handed back after a lost permit; %d left in %s\n",
		rep.Processed, rep.Jobs, rep.Duplicates, rep.Missing, rep.Redone, rep.Left, jobStream)
	fmt.Fprintf(out, "most jobs in processing at once: %d of %d permits; after: %d of %d permits available\n",
		rep.MaxActive, cfg.permits, rep.Available, cfg.permits)

	var problems []error
	if rep.Duplicates > 0 || rep.Missing > 0 || rep.Left > 0 {
		problems = append(problems, fmt.Errorf("jobs not processed exactly once: %d duplicated, %d missing, %d left", rep.Duplicates, rep.Missing, rep.Left))
	}
	if rep.MaxActive > cfg.permits {
		problems = append(problems, fmt.Errorf("SAFETY VIOLATION: %d jobs in processing at once, %d permits", rep.MaxActive, cfg.permits))
	}
	if rep.Available != cfg.permits {
		problems = append(problems, fmt.Errorf("%d of %d permits came back", rep.Available, cfg.permits))
	}
	return rep, errors.Join(problems...)
}

// settle waits (up to 5 s) for every permit to be available again: a
// released token is handed back asynchronously.
func settle(ctx context.Context, sem *natssem.Semaphore, permits int) (int, error) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := sem.Status(ctx)
		if err != nil {
			return 0, err
		}
		if st.Available == permits || time.Now().After(deadline) {
			return st.Available, nil
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

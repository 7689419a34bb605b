package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/amqpsem"
	"github.com/tokensem/tokensem/natssem"
)

// Report is one line a worker sends the meter.
type Report struct {
	Worker int    `json:"w"`
	Op     string `json:"op"` // "acq", "releasing" (before Release), "rel", "lost", "fail" (an Acquire that failed), "reopen" (the semaphore is gone: opened again)
	Slot   int    `json:"slot,omitempty"`
	Fence  uint64 `json:"fence,omitempty"`
	Call   int64  `json:"call,omitempty"` // Acquire's call
	At     int64  `json:"at"`             // acq: Acquire's return; rel, lost: the end of the hold
	// Until is, for acq on NATS, the permit's deadline as it was handed
	// out (natssem's Permit.Deadline: the holder's belief ends there
	// unless it renews), for the log and for picking whom to stall.
	Until int64  `json:"until,omitempty"`
	Err   string `json:"err,omitempty"`
}

// Worker environment: a test binary started with WorkerEnv set runs
// RunWorker instead of its tests.
const (
	WorkerEnv  = "TOKENSEM_CHAOS_WORKER"  // the worker's id
	backendEnv = "TOKENSEM_CHAOS_BACKEND" // "nats" or "amqp"
	groupEnv   = "TOKENSEM_CHAOS_GROUP"   // nats: the semaphore is a key of this group
	urlEnv     = "TOKENSEM_CHAOS_URL"     // broker URL(s), comma-separated for NATS
	nameEnv    = "TOKENSEM_CHAOS_NAME"    // semaphore name
	meterEnv   = "TOKENSEM_CHAOS_METER"   // host:port of the meter
	// skewEnv, a duration, makes the worker read the NATS server's clock
	// that far ahead: its connection moves the time in every consumer info
	// the server sends (see skewDialer).
	skewEnv = "TOKENSEM_CHAOS_SKEW"
	// longEnv, "P:MIN-MAX" (e.g. "0.1:300ms-3s"), makes a hold last
	// between MIN and MAX with probability P, instead of 2-20 ms.
	longEnv = "TOKENSEM_CHAOS_LONG"
	// idleEnv, "P:MIN-MAX", makes the worker rest between MIN and MAX
	// after a hold with probability P, keeping its semaphore open.
	idleEnv = "TOKENSEM_CHAOS_IDLE"
)

// chance is a "P:MIN-MAX" setting: with probability p, a duration between
// lo and hi.
type chance struct {
	p      float64
	lo, hi time.Duration
}

func parseChance(env string) (chance, error) {
	v := os.Getenv(env)
	if v == "" {
		return chance{}, nil
	}
	ps, ds, ok1 := strings.Cut(v, ":")
	los, his, ok2 := strings.Cut(ds, "-")
	p, err1 := strconv.ParseFloat(ps, 64)
	lo, err2 := time.ParseDuration(los)
	hi, err3 := time.ParseDuration(his)
	if !ok1 || !ok2 || errors.Join(err1, err2, err3) != nil || hi < lo {
		return chance{}, fmt.Errorf("%s=%q: want P:MIN-MAX", env, v)
	}
	return chance{p, lo, hi}, nil
}

// draw returns a duration with probability c.p, else 0.
func (c chance) draw() time.Duration {
	if c.p == 0 || rand.Float64() >= c.p {
		return 0
	}
	return c.lo + rand.N(c.hi-c.lo+1)
}

// RunWorker acquires (in a class of its own: see class below), holds for
// a few milliseconds and releases, over and over, reporting every step to the meter, until SIGTERM. When its
// semaphore is gone (deleted: ErrNotInitialized), it opens the name again,
// waiting for the next Init. It returns the process exit code.
func RunWorker() int {
	id, _ := strconv.Atoi(os.Getenv(WorkerEnv))
	long, err := parseChance(longEnv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	idle, err := parseChance(idleEnv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	var skew time.Duration
	if v := os.Getenv(skewEnv); v != "" {
		if skew, err = time.ParseDuration(v); err != nil {
			fmt.Fprintln(os.Stderr, "worker:", skewEnv, err)
			return 1
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	m, err := net.Dial("tcp", os.Getenv(meterEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker: meter:", err)
		return 1
	}
	defer m.Close()
	w := bufio.NewWriter(m)
	enc := json.NewEncoder(w)
	report := func(r Report) {
		r.Worker = id
		if err := enc.Encode(r); err != nil || w.Flush() != nil {
			fmt.Fprintln(os.Stderr, "worker: meter gone")
			os.Exit(1)
		}
	}
	q := listenQuiet(m)
	sem, closeSem, err := openSemaphore(ctx, skew)
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker: open:", err)
		return 1
	}
	defer func() { closeSem() }()
	// Workers wait in three classes (-1, 0, 1 by id): safety must not
	// depend on every waiter being of one class.
	class := tokensem.Priority(id%3 - 1)
	woke := false // the last rest was one the meter asked for
	for ctx.Err() == nil {
		if q.rest(ctx) {
			woke = true
		}
		actx, cancel := context.WithTimeout(tokensem.WithPriority(ctx, class), 20*time.Second)
		stop := q.cancelOnQuiet(cancel)
		call := time.Now().UnixNano()
		p, err := sem.Acquire(actx)
		stop()
		cancel()
		if err != nil {
			if ctx.Err() != nil || q.resting() {
				continue
			}
			report(Report{Op: "fail", Call: call, At: time.Now().UnixNano(), Err: err.Error()})
			if errors.Is(err, tokensem.ErrNotInitialized) || errors.Is(err, tokensem.ErrClosed) {
				closeSem()
				if sem, closeSem, err = openSemaphore(ctx, skew); err != nil {
					closeSem = func() {}
					return 0 // ctx ended
				}
				report(Report{Op: "reopen", At: time.Now().UnixNano()})
				continue
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		acq := Report{Op: "acq", Slot: p.Token().Index, Fence: p.Fence(), Call: call, At: time.Now().UnixNano()}
		if d := p.Deadline(); !d.IsZero() {
			acq.Until = d.UnixNano()
		}
		report(acq)
		d := long.draw()
		if woke && long.p > 0 {
			// A worker woken from a quiet rest (its semaphore may be a
			// new life by now) holds long: long enough for the lease and
			// renewals of that life to matter.
			d = long.lo + rand.N(long.hi-long.lo+1)
		}
		woke = false
		if d == 0 {
			d = time.Duration(2+rand.IntN(18)) * time.Millisecond
		}
		hold := time.NewTimer(d)
		select {
		case <-p.Done():
			hold.Stop()
			report(Report{Op: "lost", Slot: p.Token().Index, Fence: p.Fence(), At: time.Now().UnixNano(), Err: errString(p.Err())})
			continue
		case <-hold.C:
		case <-q.hush:
			hold.Stop()
		case <-ctx.Done():
			hold.Stop()
		}
		end := time.Now().UnixNano()
		// Said before the call: a kill that lands once the release took
		// effect, before "rel" is reported, must not look like a kill of a
		// holder (a run failed so: its slot was taken 5 ms before the kill).
		report(Report{Op: "releasing", Slot: p.Token().Index, Fence: p.Fence(), At: end})
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		err = p.Release(rctx)
		rcancel()
		op := "rel"
		if errors.Is(err, tokensem.ErrLeaseLost) {
			op = "lost"
		}
		report(Report{Op: op, Slot: p.Token().Index, Fence: p.Fence(), At: end, Err: errString(err)})
		if d := idle.draw(); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
			}
		}
	}
	return 0
}

// quiet is the meter's word to rest: "quiet D" on the worker's meter
// connection ends its wait in Acquire or its hold (it releases) and keeps
// it from acquiring for D, with its semaphore open.
type quiet struct {
	mu     sync.Mutex
	until  time.Time
	cancel context.CancelFunc // of the Acquire under way
	hush   chan struct{}      // a hold under way ends when it receives
}

func listenQuiet(m net.Conn) *quiet {
	q := &quiet{hush: make(chan struct{}, 1)}
	go func() {
		sc := bufio.NewScanner(m)
		for sc.Scan() {
			v, ok := strings.CutPrefix(sc.Text(), "quiet ")
			d, err := time.ParseDuration(v)
			if !ok || err != nil {
				continue
			}
			q.mu.Lock()
			q.until = time.Now().Add(d)
			if q.cancel != nil {
				q.cancel()
			}
			q.mu.Unlock()
			select {
			case q.hush <- struct{}{}:
			default:
			}
		}
	}()
	return q
}

// rest waits while the worker is told to be quiet, and reports whether it
// did.
func (q *quiet) rest(ctx context.Context) (rested bool) {
	for ctx.Err() == nil {
		select {
		case <-q.hush: // said before or during this rest
		default:
		}
		q.mu.Lock()
		d := time.Until(q.until)
		q.mu.Unlock()
		if d <= 0 {
			return rested
		}
		rested = true
		select {
		case <-time.After(d):
		case <-ctx.Done():
		}
	}
	return rested
}

func (q *quiet) resting() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return time.Now().Before(q.until)
}

// cancelOnQuiet makes a quiet word cancel the Acquire under way, until
// the returned stop is called.
func (q *quiet) cancelOnQuiet(cancel context.CancelFunc) (stop func()) {
	q.mu.Lock()
	q.cancel = cancel
	if time.Now().Before(q.until) {
		cancel() // said since rest returned
	}
	q.mu.Unlock()
	return func() {
		q.mu.Lock()
		q.cancel = nil
		q.mu.Unlock()
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// openSemaphore connects to the broker (retrying while it is down) and
// opens the semaphore (retrying while it does not exist). A NATS
// connection sees the server's clock skew ahead.
func openSemaphore(ctx context.Context, skew time.Duration) (tokensem.Semaphore, func(), error) {
	name, url := os.Getenv(nameEnv), os.Getenv(urlEnv)
	for {
		s, closeFn, err := tryOpen(ctx, os.Getenv(backendEnv), url, name, skew)
		if err == nil || ctx.Err() != nil {
			return s, closeFn, err
		}
		if errors.Is(err, tokensem.ErrNotInitialized) {
			// Deleted, and not made again yet: look again soon.
			time.Sleep(20*time.Millisecond + rand.N(20*time.Millisecond))
			continue
		}
		fmt.Fprintln(os.Stderr, "worker: open (retrying):", err)
		time.Sleep(200 * time.Millisecond)
	}
}

func tryOpen(ctx context.Context, backend, url, name string, skew time.Duration) (tokensem.Semaphore, func(), error) {
	octx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	switch backend {
	case "nats":
		copts := []nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond),
			nats.ReconnectJitter(10*time.Millisecond, 10*time.Millisecond), nats.RetryOnFailedConnect(false)}
		if skew != 0 {
			copts = append(copts, nats.SetCustomDialer(&skewDialer{ahead: skew, Dialer: net.Dialer{Timeout: nats.DefaultTimeout}}))
		}
		nc, err := nats.Connect(url, copts...)
		if err != nil {
			return nil, nil, err
		}
		opts := []natssem.Option{natssem.WithLogger(workerLog())}
		if g := os.Getenv(groupEnv); g != "" {
			opts = append(opts, natssem.WithGroup(g))
		}
		s, err := natssem.Open(octx, nc, name, opts...)
		if err != nil {
			nc.Close()
			return nil, nil, err
		}
		return s, func() { _ = s.Close(); nc.Close() }, nil
	case "amqp":
		c, err := amqpsem.Dial(octx, url, amqpsem.WithHeartbeat(time.Second), amqpsem.WithDialLogger(workerLog()))
		if err != nil {
			return nil, nil, err
		}
		s, err := amqpsem.Open(octx, c, name, amqpsem.WithLogger(workerLog()))
		if err != nil {
			_ = c.Close()
			return nil, nil, err
		}
		return s, func() { _ = s.Close(); _ = c.Close() }, nil
	}
	return nil, nil, fmt.Errorf("worker: backend %q (urls %s)", backend, strings.TrimSpace(url))
}

// workerLog writes a backend's warnings to the worker's stderr, which the
// harness prints when a run fails.
func workerLog() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

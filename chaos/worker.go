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
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/amqpsem"
	"github.com/tokensem/tokensem/internal/testhook"
	"github.com/tokensem/tokensem/natssem"
)

// Report is one line a worker sends the meter.
type Report struct {
	Worker int    `json:"w"`
	Op     string `json:"op"` // "acq", "releasing" (before Release), "rel", "lost", "fail" (an Acquire that failed)
	Slot   int    `json:"slot,omitempty"`
	Fence  uint64 `json:"fence,omitempty"`
	Call   int64  `json:"call,omitempty"` // Acquire's call
	At     int64  `json:"at"`             // acq: Acquire's return; rel, lost: the end of the hold
	Err    string `json:"err,omitempty"`
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
	// that far ahead (see testhook.SetServerClockAhead).
	skewEnv = "TOKENSEM_CHAOS_SKEW"
)

// RunWorker acquires, holds for a few milliseconds and releases, over and
// over, reporting every step to the meter, until SIGTERM. It returns the
// process exit code.
func RunWorker() int {
	id, _ := strconv.Atoi(os.Getenv(WorkerEnv))
	if v := os.Getenv(skewEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			fmt.Fprintln(os.Stderr, "worker:", skewEnv, err)
			return 1
		}
		testhook.SetServerClockAhead(d)
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
	sem, closeSem, err := openSemaphore(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker: open:", err)
		return 1
	}
	defer closeSem()
	for ctx.Err() == nil {
		actx, cancel := context.WithTimeout(ctx, 20*time.Second)
		call := time.Now().UnixNano()
		p, err := sem.Acquire(actx)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				report(Report{Op: "fail", Call: call, At: time.Now().UnixNano(), Err: err.Error()})
				time.Sleep(10 * time.Millisecond)
			}
			continue
		}
		report(Report{Op: "acq", Slot: p.Token().Index, Fence: p.Fence(), Call: call, At: time.Now().UnixNano()})
		hold := time.NewTimer(time.Duration(2+rand.IntN(18)) * time.Millisecond)
		select {
		case <-p.Done():
			hold.Stop()
			report(Report{Op: "lost", Slot: p.Token().Index, Fence: p.Fence(), At: time.Now().UnixNano(), Err: errString(p.Err())})
			continue
		case <-hold.C:
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
	}
	return 0
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// openSemaphore connects to the broker (retrying while it is down) and
// opens the semaphore.
func openSemaphore(ctx context.Context) (tokensem.Semaphore, func(), error) {
	name, url := os.Getenv(nameEnv), os.Getenv(urlEnv)
	for {
		s, closeFn, err := tryOpen(ctx, os.Getenv(backendEnv), url, name)
		if err == nil || ctx.Err() != nil {
			return s, closeFn, err
		}
		fmt.Fprintln(os.Stderr, "worker: open (retrying):", err)
		time.Sleep(200 * time.Millisecond)
	}
}

func tryOpen(ctx context.Context, backend, url, name string) (tokensem.Semaphore, func(), error) {
	octx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	switch backend {
	case "nats":
		nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
			nats.ReconnectJitter(10*time.Millisecond, 10*time.Millisecond), nats.RetryOnFailedConnect(false))
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

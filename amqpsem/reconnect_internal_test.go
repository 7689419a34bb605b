package amqpsem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/rabbittest"
)

// TestLifecycleRidesOverDroppedConnections: the Conn's watchdog drops a
// connection that stayed silent for 1.5 heartbeats (a loaded machine
// starves it), and the Conn connects again. Init, Open and Delete are
// idempotent and hold no permit: one the drop cut short tries again on the
// next connection, within its context, instead of failing. The drops here
// are the watchdog's own (the holders told, then the socket closed), at
// random moments while the calls run; rounds go on until drops have cut a
// few calls short. A Delete that returned, and the cleanup, leave nothing
// of their semaphores on the broker. It runs beside others: the drops are
// of its own Conn.
func TestLifecycleRidesOverDroppedConnections(t *testing.T) {
	t.Parallel()
	b := rabbittest.Need(t)
	ctx := t.Context()
	retries := &retryCounter{}
	log := slog.New(retries)
	c, err := Dial(ctx, b.URL, WithDialLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	prefix := fmt.Sprintf("redial-%d-", time.Now().UnixNano())
	const permits = 3
	var names []string
	defer func() {
		fc, err := Dial(context.Background(), b.URL)
		if err != nil {
			t.Errorf("dial for cleanup: %v", err)
			return
		}
		defer fc.Close()
		for _, n := range names {
			if err := ForceDelete(context.Background(), fc, n); err != nil && !errors.Is(err, tokensem.ErrNotInitialized) {
				t.Errorf("cleanup %s: %v", n, err)
			}
			nothingLeft(t, b.URL, n, permits)
		}
	}()

	var (
		stop  = make(chan struct{})
		drops atomic.Int64
		wg    sync.WaitGroup
	)
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(250+rand.IntN(400)) * time.Millisecond):
			}
			c.mu.Lock()
			s := c.cur
			c.mu.Unlock()
			if isDone(s.lost) {
				continue // still connecting again
			}
			// What the watchdog does (see watch).
			s.markLost()
			_ = s.sock.Close()
			drops.Add(1)
		}
	})
	halt := func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}
	defer halt()

	// A round takes a few hundred milliseconds, and the drops cut one call
	// in four short, measured: 40 rounds leave a run with none a chance
	// of about 1 in 10^4.
	const maxRounds = 60
	for i := 0; i < maxRounds && retries.n.Load() < 3; i++ {
		name := prefix + fmt.Sprint(i)
		names = append(names, name)
		cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		s, err := Init(cctx, c, name, permits, WithLogger(log))
		if err != nil {
			cancel()
			t.Fatalf("round %d: init: %v", i, err)
		}
		s.Close()
		s, err = Open(cctx, c, name, WithLogger(log))
		if err != nil {
			cancel()
			t.Fatalf("round %d: open: %v", i, err)
		}
		s.Close()
		if i%2 == 0 {
			if err := Delete(cctx, c, name); err != nil {
				cancel()
				t.Fatalf("round %d: delete: %v", i, err)
			}
		}
		cancel()
	}
	halt()
	t.Logf("%d rounds, %d connections dropped, %d calls cut short and tried again", len(names), drops.Load(), retries.n.Load())
	if retries.n.Load() == 0 {
		t.Fatal("no drop cut a call short: nothing was tried")
	}

	// What was made is whole: every permit of a semaphore that was not
	// deleted is there and free. What was deleted is gone, all of it.
	for i, name := range names {
		if i%2 == 0 {
			nothingLeft(t, b.URL, name, permits)
			continue
		}
		s, err := Open(ctx, c, name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		st, err := s.Status(ctx)
		s.Close()
		if err != nil {
			t.Fatalf("%s: status: %v", name, err)
		}
		if st.Available != permits || !st.Healthy {
			t.Errorf("%s: %d of %d permits available, healthy %v", name, st.Available, permits, st.Healthy)
		}
	}
}

// retryCounter is a slog.Handler that counts the warnings of a step tried
// again after a broker failure (backoff.Retry's "…; retrying").
type retryCounter struct{ n atomic.Int64 }

func (r *retryCounter) Enabled(context.Context, slog.Level) bool { return true }
func (r *retryCounter) Handle(_ context.Context, rec slog.Record) error {
	if rec.Level == slog.LevelWarn && strings.HasSuffix(rec.Message, "the broker failed; retrying") {
		r.n.Add(1)
	}
	return nil
}
func (r *retryCounter) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *retryCounter) WithGroup(string) slog.Handler      { return r }

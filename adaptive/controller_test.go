package adaptive_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/adaptive"
	"github.com/tokensem/tokensem/internal/semtest"
	"github.com/tokensem/tokensem/natssem"
	"github.com/tokensem/tokensem/natssem/embedded"
)

// sharedServer is a downstream of capacity C shared by processor sharing:
// with k uses under way each takes S·max(1, k/C); a use that finds more
// than C+Q under way is refused at once (ErrOverload).
type sharedServer struct {
	c, q    atomic.Int64
	s       time.Duration
	inside  atomic.Int64
	refused atomic.Int64
}

func (d *sharedServer) use(ctx context.Context) error {
	k := d.inside.Add(1)
	defer d.inside.Add(-1)
	c := d.c.Load()
	if k > c+d.q.Load() {
		d.refused.Add(1)
		return fmt.Errorf("downstream full: %w", tokensem.ErrOverload)
	}
	select {
	case <-time.After(time.Duration(float64(d.s) * max(1, float64(k)/float64(c)))):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// process is one member of the fleet: its own connection, a handle of the
// semaphore that feeds a Window, and a goroutine publishing the window's
// reports.
type process struct {
	nc  *nats.Conn
	sem *natssem.Semaphore
}

func startProcess(t *testing.T, ctx context.Context, url, name, id string, window time.Duration) *process {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	w := adaptive.NewWindow(name)
	s, err := natssem.Open(ctx, nc, name, natssem.WithObserver(w))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	var wg sync.WaitGroup
	pctx, cancel := context.WithCancel(ctx)
	wg.Go(func() { _ = adaptive.Publish(pctx, w, id, window, s.PublishReport) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	return &process{nc: nc, sem: s}
}

// testLog writes a log to the test's output (shown when it fails, or with
// -v).
type testLog struct{ t *testing.T }

func (l testLog) Write(b []byte) (int, error) {
	l.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// controllerOn runs a controller of name on a connection of its own (its
// "process"), with a one-permit leader semaphore of lease 1 s; decisions
// go to decided. It returns the connection, whose Close is the process's
// death.
func controllerOn(t *testing.T, ctx context.Context, url, name string, window time.Duration, decided func(adaptive.Decision), id string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	s, err := natssem.Open(ctx, nc, name)
	if err != nil {
		t.Fatal(err)
	}
	leader, err := natssem.Init(ctx, nc, name+"-leader", 1, natssem.WithLease(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	reports := make(chan adaptive.Report, 256)
	stop, err := s.SubscribeReports(reports)
	if err != nil {
		t.Fatal(err)
	}
	c := &adaptive.Controller{
		Leader: leader,
		Resize: func(ctx context.Context, n int) error { _, err := s.Resize(ctx, n); return err },
		Permits: func(ctx context.Context) (int, error) {
			st, err := s.Status(ctx)
			return st.Permits, err
		},
		Reports:   reports,
		Algorithm: &adaptive.Gradient{},
		Bounds:    adaptive.Bounds{Min: 1, Max: 32, MaxStep: 4},
		Window:    window,
		Decided:   decided,
		Logger:    slog.New(slog.NewTextHandler(testLog{t}, nil)).With("controller", id),
	}
	cctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := c.Run(cctx); !errors.Is(err, context.Canceled) && !errors.Is(err, tokensem.ErrClosed) {
			t.Errorf("controller: %v", err)
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait(); stop(); _ = leader.Close(); _ = s.Close() })
	return nc
}

// TestControllerFindsCapacityAndFailsOver: three processes keep 24 callers
// on a semaphore that starts at 2 permits, in front of a downstream of
// capacity 6. The leading controller moves the count to within 20% of 6
// (the target, here with 200 ms windows); never more callers than
// permits hold at once. Then the leader's process dies (its connection
// closes) and resizes no more; the other controller leads within the
// leader permit's lease and keeps the count near capacity.
func TestControllerFindsCapacityAndFailsOver(t *testing.T) {
	srv, err := embedded.Start(embedded.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	ctx := semtest.Context(t, 90*time.Second)
	const name, window = "adapt", 200 * time.Millisecond
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	admin, err := natssem.Init(ctx, nc, name, 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close() })

	down := &sharedServer{s: 20 * time.Millisecond}
	down.c.Store(6)
	down.q.Store(6)
	var (
		mu          sync.Mutex
		decisions   []adaptive.Decision
		by          = map[int]int{}             // decisions per controller
		died        = time.Now().Add(time.Hour) // when the first controller's process dies
		resizedDead int                         // resizes it decided after
	)
	decided := func(who int) func(adaptive.Decision) {
		return func(d adaptive.Decision) {
			mu.Lock()
			decisions = append(decisions, d)
			by[who]++
			if who == 1 && d.To != d.From && d.Err == nil && d.At.After(died) {
				resizedDead++
			}
			mu.Unlock()
		}
	}
	first := controllerOn(t, ctx, srv.URL(), name, window, decided(1), "first")
	time.Sleep(100 * time.Millisecond) // the first leads
	controllerOn(t, ctx, srv.URL(), name, window, decided(2), "second")

	var meter semtest.Meter
	wctx, stopWork := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for p := range 3 {
		proc := startProcess(t, ctx, srv.URL(), name, fmt.Sprint("p", p), window)
		for range 8 {
			wg.Go(func() {
				for wctx.Err() == nil {
					_ = tokensem.Do(wctx, proc.sem, func(ctx context.Context) error {
						meter.Enter()
						defer meter.Leave()
						return down.use(ctx)
					})
				}
			})
		}
	}
	t.Cleanup(func() { stopWork(); wg.Wait() })

	count := func() int { return admin.Permits() }
	settled := func(what string, within time.Duration) {
		t.Helper()
		deadline := time.Now().Add(within)
		for inRange := 0; inRange < 5; time.Sleep(window) {
			st, err := admin.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if n := st.Permits; n >= 5 && n <= 8 { // 6 ± 20%, rounded out
				inRange++
			} else {
				inRange = 0
			}
			if time.Now().After(deadline) {
				mu.Lock()
				defer mu.Unlock()
				t.Fatalf("%s: the count is %d after %v, want within 20%% of the capacity 6; last decisions %+v", what, count(), within, decisions[max(0, len(decisions)-5):])
			}
		}
	}
	settled("from 2", 20*time.Second)

	// The leader dies.
	mu.Lock()
	led := by[1]
	mu.Unlock()
	if led == 0 {
		t.Fatal("the first controller never decided: it was not the leader")
	}
	st, err := admin.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	before := st.Permits
	mu.Lock()
	died = time.Now()
	mu.Unlock()
	first.Close()
	var took time.Duration
	for {
		mu.Lock()
		n := by[2]
		mu.Unlock()
		if n > 0 {
			took = time.Since(died)
			break
		}
		if time.Since(died) > 10*time.Second {
			t.Fatal("the second controller did not lead within 10 s of the leader's death")
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("the second controller led %v after the first one's connection closed (leader lease 1 s); the count was %d", took, before)
	settled("after the failover", 20*time.Second)
	stopWork()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if resizedDead > 0 {
		t.Errorf("the first controller resized %d times after its connection closed", resizedDead)
	}
	most := 2
	for _, d := range decisions {
		most = max(most, d.To)
	}
	if m := meter.Max(); m > most {
		t.Errorf("%d callers held at once, above the largest count the controllers set, %d", m, most)
	}
	t.Logf("downstream refused %d uses; %d callers inside at most", down.refused.Load(), meter.Max())
}

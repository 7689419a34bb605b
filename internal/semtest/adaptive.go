package semtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/adaptive"
	"github.com/tokensem/tokensem/reconciler"
)

// adaptable is what an adaptive controller needs of a backend's semaphore:
// its Resize and its report channel.
type adaptable interface {
	tokensem.Semaphore
	Resize(ctx context.Context, permits int) (reconciler.Report, error)
	PublishReport(r adaptive.Report) error
	SubscribeReports(out chan<- adaptive.Report) (stop func(), err error)
}

// Downstream is a resource of capacity C shared by processor sharing:
// with k uses under way each takes S·max(1, k/C); a use that finds more
// than C+Q under way is refused at once, with an error wrapping
// tokensem.ErrOverload.
type Downstream struct {
	C, Q    atomic.Int64
	S       time.Duration
	inside  atomic.Int64
	Refused atomic.Int64
}

// Use uses the downstream once.
func (d *Downstream) Use(ctx context.Context) error {
	k := d.inside.Add(1)
	defer d.inside.Add(-1)
	c := d.C.Load()
	if k > c+d.Q.Load() {
		d.Refused.Add(1)
		return fmt.Errorf("downstream full: %w", tokensem.ErrOverload)
	}
	select {
	case <-time.After(time.Duration(float64(d.S) * max(1, float64(k)/float64(c)))):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// testAdaptiveController: two processes keep 12 callers on a semaphore
// that starts at 1 permit, in front of a downstream of capacity 4; each
// process's Window reports once a window over the backend's report
// channel. Of two controllers, the one that holds the leader semaphore's
// permit moves the count to within 20% of 4 and keeps it there; never more
// callers hold than the largest count set. Then the leader's connection
// to the leader semaphore crashes, and the other controller decides
// within the leader's lease and the resize it may wait for; the first
// decides no resize after the second has decided.
func testAdaptiveController(t *testing.T, b Backend) {
	const (
		window   = 200 * time.Millisecond
		lease    = time.Second
		capacity = 4
	)
	name, leaderName := uniqueName(t), uniqueName(t)
	admin, ok := mustInit(t, b, name, 1, Options{}).(adaptable)
	if !ok {
		t.Skipf("%s semaphores have no report channel", b.Name)
	}
	mustInit(t, b, leaderName, 1, Options{Lease: lease})
	ctx := Context(t, 2*time.Minute)

	var (
		mu          sync.Mutex
		decisions   []adaptive.Decision
		by          = map[int]int{}
		secondLed   time.Time // the second controller's first decision
		resizedDead int       // resizes the first decided after that
	)
	var leaders []tokensem.Semaphore
	var wg sync.WaitGroup
	cctx, stopControllers := context.WithCancel(ctx)
	defer func() { stopControllers(); wg.Wait() }()
	for who := range 2 {
		own := mustOpen(t, b, b.Addr, name, Options{}).(adaptable)
		leader := mustOpen(t, b, b.Addr, leaderName, Options{Lease: lease})
		leaders = append(leaders, leader)
		reports := make(chan adaptive.Report, 256)
		stop, err := own.SubscribeReports(reports)
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		c := &adaptive.Controller{
			Leader: leader,
			Resize: func(ctx context.Context, n int) error { _, err := own.Resize(ctx, n); return err },
			Permits: func(ctx context.Context) (int, error) {
				st, err := own.Status(ctx)
				return st.Permits, err
			},
			Reports:   reports,
			Algorithm: &adaptive.Gradient{},
			Bounds:    adaptive.Bounds{Min: 1, Max: 16, MaxStep: 2},
			Window:    window,
			Decided: func(d adaptive.Decision) {
				mu.Lock()
				defer mu.Unlock()
				decisions = append(decisions, d)
				by[who]++
				if who == 1 && secondLed.IsZero() {
					secondLed = d.At
				}
				if who == 0 && d.To != d.From && d.Err == nil && !secondLed.IsZero() && d.At.After(secondLed) {
					resizedDead++
				}
				if d.Err != nil {
					t.Logf("controller %d: resize %d -> %d at %v failed: %v", who, d.From, d.To, d.At.Format("15:04:05.000"), d.Err)
				}
			},
		}
		wg.Go(func() {
			if err := c.Run(cctx); !errors.Is(err, context.Canceled) && !errors.Is(err, tokensem.ErrClosed) {
				t.Errorf("controller %d: %v", who, err)
			}
		})
		if who == 0 { // the first leads
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				if st, err := leader.Status(ctx); err == nil && st.Held == 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the first controller never took the leader's permit")
				}
			}
		}
	}

	down := &Downstream{S: 10 * time.Millisecond}
	down.C.Store(capacity)
	down.Q.Store(capacity)
	var meter Meter
	wctx, stopWork := context.WithCancel(ctx)
	var work sync.WaitGroup
	defer func() { stopWork(); work.Wait() }()
	for p := range 2 {
		w := adaptive.NewWindow(name)
		s := mustOpen(t, b, b.Addr, name, Options{Observer: w}).(adaptable)
		work.Go(func() { _ = adaptive.Publish(wctx, w, fmt.Sprint("process-", p), window, s.PublishReport) })
		for range 6 {
			work.Go(func() {
				for wctx.Err() == nil {
					_ = tokensem.Do(wctx, s, func(ctx context.Context) error {
						meter.Enter()
						defer meter.Leave()
						return down.Use(ctx)
					})
				}
			})
		}
	}

	settled := func(what string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for inRange := 0; inRange < 5; time.Sleep(window) {
			st, err := admin.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if st.Permits >= capacity*4/5 && st.Permits <= (capacity*6+4)/5 { // within 20%, rounded out
				inRange++
			} else {
				inRange = 0
			}
			if time.Now().After(deadline) {
				mu.Lock()
				defer mu.Unlock()
				t.Fatalf("%s: the count is %d after 30 s, want within 20%% of the capacity %d; last decisions %+v",
					what, st.Permits, capacity, decisions[max(0, len(decisions)-5):])
			}
		}
	}
	settled("from 1")

	mu.Lock()
	if by[0] == 0 || by[1] > 0 {
		mu.Unlock()
		t.Fatalf("decisions by controller: %v; want the first alone to lead", by)
	}
	mu.Unlock()
	died := time.Now()
	b.Crash(t, leaders[0])
	// The second decides once it leads and a resize under way is done.
	for bound := 4*lease + 40*time.Second; ; time.Sleep(20 * time.Millisecond) {
		mu.Lock()
		n := by[1]
		mu.Unlock()
		if n > 0 {
			break
		}
		if time.Since(died) > bound {
			t.Fatalf("the second controller did not decide within %v of the leader's crash", bound)
		}
	}
	t.Logf("the second controller decided %v after the leader's connection crashed (lease %v)", time.Since(died).Round(time.Millisecond), lease)
	// How well the new leader tracks the capacity is the bench's to
	// measure: it starts without the old one's baseline latency.
	time.Sleep(5 * window)
	stopWork()
	work.Wait()
	// A resize under way has written the new count, which clients admit
	// by, before its repair ends and it is decided: every decision is in
	// once the controllers have stopped.
	stopControllers()
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	if resizedDead > 0 {
		t.Errorf("the first controller resized %d times after it lost the lead", resizedDead)
	}
	most := 1
	for _, d := range decisions {
		most = max(most, d.To)
	}
	if m := meter.Max(); m > most {
		t.Errorf("%d callers held at once, above the largest count the controllers set, %d", m, most)
	}
	t.Logf("%d decisions; the downstream refused %d uses; %d callers inside at most", len(decisions), down.Refused.Load(), meter.Max())
}

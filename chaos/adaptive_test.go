package chaos

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/adaptive"
	"github.com/tokensem/tokensem/amqpsem"
	"github.com/tokensem/tokensem/driver"
	"github.com/tokensem/tokensem/internal/rabbittest"
	"github.com/tokensem/tokensem/internal/semtest"
	"github.com/tokensem/tokensem/natssem"
	"github.com/tokensem/tokensem/natssem/embedded"
	"github.com/tokensem/tokensem/reconciler"
)

// The adaptive chaos scenarios: the workers hold and are faulted as in
// the fixed-N ones, while an adaptive.Controller moves N. The fleet's
// reports are made up so that N keeps moving: each window a report says
// the downstream refused some uses (AIMD takes one or more off) or not
// (AIMD adds one), at random, so the count walks within adaptMin..adaptMax
// and a resize runs most windows. The reports travel over the semaphore's
// own report channel to the controller, which resizes through the
// backend's Resize; each resize is a Resize of the run's one life, and the
// history is held to the capacity rule (max(old, new) while clients learn
// a new count, CheckTimeline).

const (
	adaptMin    = 2
	adaptMax    = 6
	adaptWindow = 500 * time.Millisecond
)

// adaptable is what the controller needs of the semaphore.
type adaptable interface {
	tokensem.Semaphore
	Resize(ctx context.Context, permits int) (reconciler.Report, error)
	PublishReport(ctx context.Context, r adaptive.Report) error
	SubscribeReports(ctx context.Context, out chan<- adaptive.Report) (stop func(), err error)
}

// adaptWhile runs the controller and the made-up reports on sem (leader
// its one-permit leader semaphore) while inject runs, and records each
// resize in r's life. The life must be r's only one.
func adaptWhile(t *testing.T, r *run, sem adaptable, leader tokensem.Semaphore, inject func()) {
	ctx, stop := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	reports := make(chan adaptive.Report, 64)
	unsub, err := sem.SubscribeReports(ctx, reports)
	if err != nil {
		t.Fatal(err)
	}
	defer unsub()

	var mu sync.Mutex
	cur := r.permitsNow()
	resizes, failed := 0, 0
	c := &adaptive.Controller{
		Leader: leader,
		Resize: func(ctx context.Context, n int) error {
			mu.Lock()
			rz := Resize{Begin: now(), From: cur, To: n}
			mu.Unlock()
			_, err := sem.Resize(ctx, n)
			if err != nil {
				// It may have written the count before it failed: wait
				// for a write still on its way, and record what is there.
				time.Sleep(500 * time.Millisecond)
				var st tokensem.Status
				var serr error
				for try := 0; try < 3; try++ {
					if st, serr = sem.Status(context.WithoutCancel(ctx)); serr == nil {
						break
					}
				}
				if serr != nil {
					t.Errorf("the count after a failed resize to %d: %v (the history cannot be checked)", n, serr)
					return err
				}
				rz.To = st.Permits
			}
			rz.End = now()
			mu.Lock()
			cur = rz.To
			if err != nil {
				failed++
			}
			changed := rz.To != rz.From
			if changed {
				resizes++
			}
			mu.Unlock()
			if !changed {
				return err // nothing written: nothing to record
			}
			r.mu.Lock()
			r.lives[0].Resizes = append(r.lives[0].Resizes, rz)
			r.mu.Unlock()
			kind := "grow"
			if rz.To < rz.From {
				kind = "shrink"
			}
			r.record(fault{worker: -1, kind: kind, begin: rz.Begin, end: rz.End})
			return err
		},
		Permits: func(ctx context.Context) (int, error) {
			st, err := sem.Status(ctx)
			return st.Permits, err
		},
		Reports:   reports,
		Algorithm: &adaptive.AIMD{Backoff: 0.75},
		Bounds:    adaptive.Bounds{Min: adaptMin, Max: adaptMax},
		Window:    adaptWindow,
	}
	wg.Go(func() {
		if err := c.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("controller: %v", err)
		}
	})
	wg.Go(func() {
		tick := time.NewTicker(adaptWindow)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			s := adaptive.Sample{Busy: adaptMax, Holds: 100, RTT: time.Millisecond}
			if rand.N(2) == 0 {
				s.Drops = 10
			}
			_ = sem.PublishReport(ctx, adaptive.Report{From: "chaos", Sample: s})
		}
	})
	inject()
	stop()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	t.Logf("the controller changed the count %d times (%d resizes failed) between %d and %d; the count is %d", resizes, failed, adaptMin, adaptMax, cur)
	// On RabbitMQ a growth into a slot that an earlier shrink retired
	// waits W + W/3 (10 s) before it issues the slot's token (a holder cut
	// off from the broker may still believe it holds it), so N moves
	// slowly there: a few resizes are enough to count.
	if resizes < 2 {
		t.Errorf("the controller resized only %d times: N hardly moved", resizes)
	}
}

// startLife makes r's one life, from Init's call (created) to now.
func (r *run) startLife(created int64, permits int, lease time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lives = []Life{{Created: created, Ready: now(), Permits: permits, Lease: lease}}
}

// TestChaosNATSAdaptive: TestChaosNATS's worker faults (kill, freeze, cut,
// delay, partition) while an adaptive controller moves N.
func TestChaosNATSAdaptive(t *testing.T) {
	p := chosenProfile(t)
	srv, err := embedded.Start(embedded.Config{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx := semtest.Context(t, time.Minute)
	name := "chaos-nats-adapt"
	created := now()
	sem, err := natssem.Init(ctx, nc, name, p.permits, natssem.WithLease(natsLease))
	if err != nil {
		t.Fatal(err)
	}
	defer sem.Close()
	leader, err := natssem.Init(ctx, nc, name+"-lead", 1, natssem.WithLease(natsLease))
	if err != nil {
		t.Fatal(err)
	}
	defer leader.Close()

	ps := proxies(t, p.workers, srv.Addr().String())
	r := newRun(t, p, "nats-adaptive", "nats", name, func(pos int) string { return "nats://" + ps[pos].Addr() }, natsRules()...)
	r.startLife(created, p.permits, natsLease)
	adaptWhile(t, r, sem, leader, func() {
		r.inject(map[string]func(){
			"kill":      r.kill,
			"freeze":    func() { r.freeze(natsLease + natsLease/2) },
			"cut":       func() { r.cut(ps) },
			"delay":     func() { r.delay(ps, natsLease/4) },
			"partition": func() { r.partition(ps, natsLease+natsLease/2) },
		})
	})
	settle(t, r, sem, sem.Inventory())
	r.verdict(0)
}

// TestChaosAMQPAdaptive: TestChaosAMQP's faults while an adaptive
// controller moves N.
func TestChaosAMQPAdaptive(t *testing.T) {
	t.Parallel() // RabbitMQ's chaos runs side by side, after the NATS ones
	p := chosenProfile(t)
	b := rabbittest.Need(t)
	ctx := semtest.Context(t, time.Minute)
	c, err := amqpsem.Dial(ctx, b.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	name := "chaos-adapt-" + driver.NewToken("x", 0, 0).ID[:8]
	created := now()
	sem, err := amqpsem.Init(ctx, c, name, p.permits)
	if err != nil {
		t.Fatal(err)
	}
	defer sem.Close()
	defer func() { _ = amqpsem.ForceDelete(semtest.Context(t, time.Minute), c, name) }()
	leader, err := amqpsem.Init(ctx, c, name+"-lead", 1)
	if err != nil {
		t.Fatal(err)
	}
	defer leader.Close()
	defer func() { _ = amqpsem.ForceDelete(semtest.Context(t, time.Minute), c, name+"-lead") }()

	ps := proxies(t, p.workers, b.Addr)
	r := newRun(t, p, "amqp-adaptive", "amqp", name, func(pos int) string { return b.URLVia(ps[pos].Addr()) })
	r.startLife(created, p.permits, 0)
	adaptWhile(t, r, sem, leader, func() {
		r.inject(map[string]func(){
			"kill":   r.kill,
			"freeze": func() { r.freeze(4 * time.Second) },
			"cut":    func() { r.cut(ps) },
			"delay":  func() { r.delay(ps, 300*time.Millisecond) },
		})
	})
	settle(t, r, sem, sem.Inventory())
	r.verdict(0)
}

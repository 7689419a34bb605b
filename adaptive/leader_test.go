package adaptive_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/adaptive"
	"github.com/tokensem/tokensem/amqpsem"
	"github.com/tokensem/tokensem/internal/semtest"
	"github.com/tokensem/tokensem/internal/testenv"
	"github.com/tokensem/tokensem/natssem"
	"github.com/tokensem/tokensem/natssem/embedded"
)

var (
	srv     *embedded.Server
	brokers testenv.Brokers
)

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, testenv.NATS|testenv.Rabbit, func(b testenv.Brokers) { srv, brokers = b.NATS, b }))
}

// leaderSemaphores opens two handles, on connections of their own, of a
// new semaphore of permits permits on the named broker.
func leaderSemaphores(t *testing.T, broker string, permits int) [2]tokensem.Semaphore {
	t.Helper()
	ctx := semtest.Context(t, 30*time.Second)
	name := "adapt-leader-" + broker + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	var out [2]tokensem.Semaphore
	for i := range out {
		var s tokensem.Semaphore
		var err error
		switch broker {
		case "nats":
			nc, cerr := nats.Connect(srv.URL())
			if cerr != nil {
				t.Fatal(cerr)
			}
			t.Cleanup(nc.Close)
			if i == 0 {
				s, err = natssem.Init(ctx, nc, name, permits)
				t.Cleanup(func() { _ = natssem.ForceDelete(context.Background(), nc, name) })
			} else {
				s, err = natssem.Open(ctx, nc, name)
			}
		default:
			c, cerr := amqpsem.Dial(ctx, brokers.RabbitFor(t).URL)
			if cerr != nil {
				t.Fatal(cerr)
			}
			t.Cleanup(func() { _ = c.Close() })
			if i == 0 {
				s, err = amqpsem.Init(ctx, c, name, permits)
				t.Cleanup(func() { _ = amqpsem.ForceDelete(context.Background(), c, name) })
			} else {
				s, err = amqpsem.Open(ctx, c, name)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		out[i] = s
	}
	return out
}

// TestOnlyPermitZeroLeads: two controllers whose leader semaphore has two
// permits (resized past one after they started, say). Each can hold a
// permit at once; only the one given permit 0 leads, and the other gives
// its permit back and fails with tokensem.ErrPermitMismatch rather than
// lead beside it.
func TestOnlyPermitZeroLeads(t *testing.T) {
	for _, broker := range []string{"nats", "amqp"} {
		t.Run(broker, func(t *testing.T) {
			leaders := leaderSemaphores(t, broker, 2)
			type outcome struct {
				who int
				err error
			}
			var (
				mu     sync.Mutex
				led    []int
				ended  = make(chan outcome, 2)
				wg     sync.WaitGroup
				resize = make(chan int, 8)
			)
			ctx, stop := context.WithCancel(semtest.Context(t, 60*time.Second))
			defer func() { stop(); wg.Wait() }()
			for i, leader := range leaders {
				c := &adaptive.Controller{
					Leader:    leader,
					Resize:    func(_ context.Context, n int) error { resize <- n; return nil },
					Permits:   func(context.Context) (int, error) { return 4, nil },
					Reports:   make(chan adaptive.Report), // none: nothing is decided
					Algorithm: &adaptive.AIMD{},
					Bounds:    adaptive.Bounds{Min: 1, Max: 8},
					Window:    100 * time.Millisecond,
					Led: func(int) {
						mu.Lock()
						led = append(led, i)
						mu.Unlock()
					},
				}
				wg.Go(func() { ended <- outcome{i, c.Run(ctx)} })
			}
			// The refused controller returns; the leader runs on.
			var refused outcome
			select {
			case refused = <-ended:
			case <-time.After(20 * time.Second):
				mu.Lock()
				defer mu.Unlock()
				t.Fatalf("neither controller returned in 20 s; these led: %v", led)
			}
			if !errors.Is(refused.err, tokensem.ErrPermitMismatch) {
				t.Fatalf("controller %d returned %v; want an error wrapping tokensem.ErrPermitMismatch", refused.who, refused.err)
			}
			t.Logf("controller %d refused: %v", refused.who, refused.err)
			leader := 1 - refused.who
			// The leader leads (Led) and keeps leading.
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				mu.Lock()
				n := len(led)
				mu.Unlock()
				if n > 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("controller %d never led", leader)
				}
			}
			select {
			case o := <-ended:
				t.Fatalf("controller %d returned %v while it should lead", o.who, o.err)
			case <-time.After(500 * time.Millisecond):
			}
			// The refused controller gave its permit back: a third party
			// takes it.
			tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			p, err := leaders[refused.who].Acquire(tctx)
			if err != nil {
				t.Fatalf("the refused controller's permit never came back: %v", err)
			}
			if got := p.Token().Index; got == 0 {
				t.Errorf("took permit 0 of the leader semaphore, which the leader should hold")
			}
			_ = p.Release(context.WithoutCancel(ctx))
			stop()
			wg.Wait()
			mu.Lock()
			defer mu.Unlock()
			if len(led) != 1 || led[0] != leader {
				t.Errorf("led: %v; want only controller %d", led, leader)
			}
			if len(resize) != 0 {
				t.Errorf("%d resizes without a report", len(resize))
			}
		})
	}
}

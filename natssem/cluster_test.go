package natssem_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/natstest"
	"github.com/tokensem/tokensem/internal/semtest"
	"github.com/tokensem/tokensem/natssem"
	"github.com/tokensem/tokensem/reconciler"
)

// connectCluster connects to every node of the cluster (the client fails
// over between them), preferring node first.
func connectCluster(t testing.TB, first int) *nats.Conn {
	t.Helper()
	return connectTo(t, cluster(t), first)
}

// connectTo connects to cluster c through node first, failing over to the
// others.
func connectTo(t testing.TB, c *natstest.Cluster, first int) *nats.Conn {
	t.Helper()
	urls := []string{"nats://" + c.Addr(first)}
	for i := range c.Size() {
		if i != first {
			urls = append(urls, "nats://"+c.Addr(i))
		}
	}
	nc, err := nats.Connect(urls[0]+","+urls[1]+","+urls[2], nats.DontRandomize(), nats.MaxReconnects(-1),
		nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// TestClusterContention: on a 3-node cluster with R3, 9 clients acquire and
// release in a loop while 4 clients resize the semaphore back and forth
// between 3 and 4 permits and 4 reconcile it, all at once. No call may fail
// with a broker error (a lost compare-and-set on a replicated bucket is a
// conflict, not a failure), and no more than 4 permits may be held at once.
func TestClusterContention(t *testing.T) {
	t.Parallel()
	const (
		acquirers = 9
		resizers  = 4
		recons    = 4
		rounds    = 6
	)
	name := fmt.Sprintf("contention-%d", time.Now().UnixNano())
	ctx := semtest.Context(t, 3*time.Minute)
	admin, err := natssem.Init(ctx, connectCluster(t, 0), name, 3, natssem.WithReplicas(3), natssem.WithLease(5*time.Second))
	if err != nil {
		t.Fatalf("init: %v", err)
	}
	defer admin.Close()
	open := func(i int) *natssem.Semaphore {
		s, err := natssem.Open(ctx, connectCluster(t, i%3), name)
		if err != nil {
			t.Fatalf("open: %v", err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}

	var (
		m    semtest.Meter
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	fail := func(who string, err error) {
		mu.Lock()
		errs = append(errs, fmt.Errorf("%s: %w", who, err))
		mu.Unlock()
	}
	stop := make(chan struct{})
	for i := range acquirers {
		s := open(i)
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				actx, cancel := context.WithTimeout(ctx, 30*time.Second)
				p, err := s.Acquire(actx)
				cancel()
				if err != nil {
					fail("acquire", err)
					return
				}
				m.Enter()
				time.Sleep(2 * time.Millisecond)
				m.Leave()
				if err := p.Release(ctx); err != nil {
					fail("release", err)
					return
				}
			}
		})
	}
	var admins sync.WaitGroup
	for i := range resizers {
		s := open(i)
		admins.Go(func() {
			for r := range rounds {
				if _, err := s.Resize(ctx, 3+(r+i)%2); err != nil {
					fail("resize", err)
					return
				}
			}
		})
	}
	for i := range recons {
		s := open(i)
		admins.Go(func() {
			for range rounds {
				if _, err := reconciler.Run(ctx, s.Inventory(), true); err != nil {
					fail("reconcile", err)
					return
				}
			}
		})
	}
	admins.Wait()
	close(stop)
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}
	t.Logf("%d holds, at most %d at once", m.Total(), m.Max())
	if m.Max() > 4 {
		t.Errorf("%d holders at once; the semaphore never had more than 4 permits", m.Max())
	}
	if m.Total() < acquirers {
		t.Errorf("only %d holds: the acquirers hardly ran", m.Total())
	}
	if _, err := admin.Resize(ctx, 3); err != nil {
		t.Fatal(err)
	}
	st, err := admin.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Permits != 3 || st.Tokens != 3 || !st.Healthy || st.Held != 0 {
		t.Errorf("after the run and a resize to 3: %+v", st)
	}
}

// TestClusterLeaderLoss stops the node leading the token stream while
// permits are held and callers wait, and brings it back later. The holders
// keep their permits (their lease outlasts the election), every waiter is
// served, no call fails, and no more than N hold at once.
func TestClusterLeaderLoss(t *testing.T) { clusterLeaderLoss(t, "") }

// TestClusterLeaderLossGroup is TestClusterLeaderLoss on a key of a group
// (natssem.WithGroup), whose stream and bucket its neighbours share.
func TestClusterLeaderLossGroup(t *testing.T) {
	clusterLeaderLoss(t, fmt.Sprintf("leaderloss%d", time.Now().UnixNano()))
}

func clusterLeaderLoss(t *testing.T, group string) {
	const (
		permits = 2
		waiters = 6
		lease   = 8 * time.Second
	)
	c := cluster(t)
	name := fmt.Sprintf("leaderloss-%d", time.Now().UnixNano())
	ctx := semtest.Context(t, 2*time.Minute)
	var in []natssem.Option
	stream := natssem.ResourcesOf(name, "").Stream
	if group != "" {
		in, stream = []natssem.Option{natssem.WithGroup(group)}, natssem.ResourcesOf("", group).Stream
		neighbour, err := natssem.Init(ctx, connectCluster(t, 1), "neighbour", 1, natssem.WithReplicas(3), in[0])
		if err != nil {
			t.Fatal(err)
		}
		defer neighbour.Close()
	}
	admin, err := natssem.Init(ctx, connectCluster(t, 0), name, permits,
		append([]natssem.Option{natssem.WithReplicas(3), natssem.WithLease(lease)}, in...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	leader, err := c.StreamLeader(ctx, connectCluster(t, 0), stream)
	if err != nil {
		t.Fatal(err)
	}
	// Every client prefers a node that survives.
	survivor := (leader + 1) % c.Size()
	open := func() *natssem.Semaphore {
		s, err := natssem.Open(ctx, connectCluster(t, survivor), name, in...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	var holders []tokensem.Permit
	for range permits {
		p, err := open().Acquire(semtest.Context(t, 10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		holders = append(holders, p)
	}
	var (
		m    semtest.Meter
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for range permits {
		m.Enter()
	}
	for range waiters {
		s := open()
		wg.Go(func() {
			p, err := s.Acquire(semtest.Context(t, time.Minute))
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
				return
			}
			m.Enter()
			time.Sleep(50 * time.Millisecond)
			m.Leave()
			if err := p.Release(ctx); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("release: %w", err))
				mu.Unlock()
			}
		})
	}
	time.Sleep(300 * time.Millisecond) // let the waiters queue
	t0 := time.Now()
	c.Stop(leader)
	t.Logf("stopped node %d (stream leader)", leader)
	defer func() {
		if err := c.Restart(leader); err != nil {
			t.Errorf("restart node %d: %v", leader, err)
		}
		if err := c.WaitJetStream(semtest.Context(t, time.Minute)); err != nil {
			t.Error(err)
		}
	}()
	time.Sleep(2 * time.Second)
	for _, p := range holders {
		select {
		case <-p.Done():
			t.Fatalf("holder of slot %d lost its permit during the election: %v", p.Token().Index, p.Err())
		default:
		}
		m.Leave()
		if err := p.Release(ctx); err != nil {
			t.Errorf("holder release after the election: %v", err)
		}
	}
	wg.Wait()
	t.Logf("every waiter served %v after the leader stopped", time.Since(t0).Round(time.Millisecond))
	for _, err := range errs {
		if errors.Is(err, tokensem.ErrUnavailable) {
			t.Errorf("a waiter gave up on a broker error during the election: %v", err)
		} else {
			t.Error(err)
		}
	}
	if m.Max() > permits {
		t.Errorf("%d holders at once, N=%d", m.Max(), permits)
	}
	if m.Total() != permits+waiters {
		t.Errorf("%d holds, want %d", m.Total(), permits+waiters)
	}
}

// TestClusterRepairCountsItsOwnRemoval: on R3, a repair that removes junk,
// and a resize, report the semaphore healthy, although the census after
// the repair may be read from a replica that has not applied it yet (the
// reconciler counts again for a moment before it says unhealthy). A CI run
// failed so once in seminit's resize ("invalid 1; removed 1;
// healthy=false"); this test did not reproduce that failure without the
// recount (600 repairs on R3, 12 runs of the seminit test beside two busy
// loops), so it guards the property, not the race.
func TestClusterRepairCountsItsOwnRemoval(t *testing.T) {
	t.Parallel()
	name := fmt.Sprintf("repair-count-%d", time.Now().UnixNano())
	ctx := semtest.Context(t, 2*time.Minute)
	admin, err := natssem.Init(ctx, connectCluster(t, 0), name, 3, natssem.WithReplicas(3))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	s := openOn(ctx, t, 2, name)
	js, err := jetstream.New(connectCluster(t, 1))
	if err != nil {
		t.Fatal(err)
	}
	removed := 0
	for i := range 40 {
		if _, err := js.Publish(ctx, natssem.ResourcesOf(name, "").Subject, []byte(fmt.Sprintf("junk %d", i))); err != nil {
			t.Fatal(err)
		}
		r, err := reconciler.Run(ctx, s.Inventory(), true)
		if err != nil {
			t.Fatal(err)
		}
		removed += r.Removed
		if r.Removed > 0 && !r.Healthy {
			t.Fatalf("run %d: removed %d, but the report says unhealthy: %+v", i, r.Removed, r)
		}
	}
	if removed == 0 {
		t.Fatal("no junk was ever removed")
	}
	// Resizes between 3 and 4 from a client on another node than the
	// creator's: each one's reconcile must end healthy (nobody holds).
	for i := range 20 {
		r, err := s.Resize(ctx, 3+i%2)
		if err != nil {
			t.Fatal(err)
		}
		if !r.Healthy {
			t.Fatalf("resize %d to %d: unhealthy: %+v", i, 3+i%2, r)
		}
	}
}

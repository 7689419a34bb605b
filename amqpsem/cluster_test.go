package amqpsem_test

import (
	"errors"
	"log/slog"
	neturl "net/url"
	"testing"
	"time"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/amqpsem"
	"github.com/tokensem/tokensem/internal/faultproxy"
	"github.com/tokensem/tokensem/internal/rabbittest"
	"github.com/tokensem/tokensem/internal/semtest"
	"github.com/tokensem/tokensem/reconciler"
)

// dialNode connects to node alone: the test's premise is which node each
// connection is on, and a list of nodes could fail over to another one
// unnoticed (a holder on the node the test kills loses its permit; queues
// declared through another node are not where the test expects them). The
// heartbeat is the default: a killed node's connections end at once (its
// sockets close), and a short heartbeat could drop a busy node's
// connections on a loaded machine, which is not what the test is about.
func dialNode(t *testing.T, c *rabbittest.Cluster, node string, opts ...amqpsem.DialOption) *amqpsem.Conn {
	t.Helper()
	conn, err := amqpsem.Dial(semtest.Context(t, 30*time.Second), c.URL(node), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// TestClusterClaimLostWithItsNode: a slot's claim queue lives on the node
// Init made it through. When that node dies, the broker drops the queue
// and cancels the claim of a holder connected elsewhere, whose token (in
// the replicated token queue) and connection are fine. The holder must
// lose its permit at once (nothing keeps another holder off the slot any
// more), its token must come back, and a waiter through a third node must
// get it, once the slot's quarantine (W) is over; a reconcile then finds
// the semaphore whole.
func TestClusterClaimLostWithItsNode(t *testing.T) {
	t.Parallel() // beside the tests that need no cluster; NeedCluster gives each that does a cluster of its own
	c := rabbittest.NeedCluster(t)
	ctx := semtest.Context(t, 2*time.Minute)
	n := name(t)
	// Made through tsa: the configuration, token and claim queues are
	// there.
	viaA, err := amqpsem.Init(ctx, dialNode(t, c, "tsa"), n, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer viaA.Close()
	// Quorum queues left behind slow every later restart of the nodes.
	defer func() { _ = amqpsem.ForceDelete(semtest.Context(t, time.Minute), dialNode(t, c, "tsb"), n) }()
	var log semtest.SyncBuffer // the holder's log
	logger := slog.New(slog.NewTextHandler(&log, nil))
	viaB, err := amqpsem.Open(ctx, dialNode(t, c, "tsb", amqpsem.WithDialLogger(logger)), n, amqpsem.WithLogger(logger))
	if err != nil {
		t.Fatal(err)
	}
	defer viaB.Close()
	held, err := viaB.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := c.Kill("tsa"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-held.Done():
		t.Logf("the holder on tsb lost its permit %v after tsa died: %v", time.Since(start).Round(time.Millisecond), held.Err())
	case <-time.After(20 * time.Second):
		t.Fatalf("the holder on tsb kept its permit after its claim queue's node died; its log:\n%s", log.String())
	}
	if !errors.Is(held.Err(), tokensem.ErrLeaseLost) {
		t.Fatalf("Err = %v", held.Err())
	}
	viaC, err := amqpsem.Open(ctx, dialNode(t, c, "tsc"), n)
	if err != nil {
		t.Fatalf("open through tsc with tsa down: %v", err)
	}
	defer viaC.Close()
	p, err := viaC.Acquire(ctx)
	if err != nil {
		t.Fatalf("no permit through tsc after the holder lost it: %v", err)
	}
	t.Logf("permit through tsc %v after tsa died (fence %d, the lost holder's %d)", time.Since(start).Round(time.Millisecond), p.Fence(), held.Fence())
	if p.Fence() <= held.Fence() {
		t.Errorf("fence %d not above the lost holder's %d", p.Fence(), held.Fence())
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	rep, err := reconciler.Run(ctx, viaC.Inventory(), true)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Issued != 0 || len(rep.Missing) != 0 || !rep.Healthy {
		t.Fatalf("reconcile after the node loss: %+v; want it whole, nothing missing or issued", rep)
	}
}

// TestClusterStalledHolderNodeLoss: a holder connected to tsb through a
// link that stalls; its slot's claim queue lives on tsa, which is killed. A
// waiter on tsc that repairs orphans must not hold the slot while the
// stalled holder still holds its permit.
func TestClusterStalledHolderNodeLoss(t *testing.T) {
	t.Parallel() // beside the tests that need no cluster; NeedCluster gives each that does a cluster of its own
	c := rabbittest.NeedCluster(t)
	ctx := semtest.Context(t, 3*time.Minute)
	n := name(t)
	viaA, err := amqpsem.Init(ctx, dialNode(t, c, "tsa"), n, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer viaA.Close()
	defer func() { _ = amqpsem.ForceDelete(semtest.Context(t, time.Minute), dialNode(t, c, "tsc"), n) }()
	p, err := viaA.Acquire(ctx) // slot 0's claim queue is on tsa
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	u, err := neturl.Parse(c.URL("tsb"))
	if err != nil {
		t.Fatal(err)
	}
	px, err := faultproxy.New(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	u.Host = px.Addr()
	hc, err := amqpsem.Dial(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer hc.Close()
	viaB, err := amqpsem.Open(ctx, hc, n)
	if err != nil {
		t.Fatal(err)
	}
	defer viaB.Close()
	held, err := viaB.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lost := watchLoss(held)
	px.Pause()
	defer px.Resume()
	start := time.Now()
	if err := c.Kill("tsa"); err != nil {
		t.Fatal(err)
	}
	viaC, err := amqpsem.Open(ctx, dialNode(t, c, "tsc"), n, amqpsem.WithOrphanRepair(time.Second))
	if err != nil {
		t.Fatalf("open through tsc with tsa down: %v", err)
	}
	defer viaC.Close()
	pc, err := viaC.Acquire(ctx)
	got := time.Now()
	if err != nil {
		t.Fatalf("no permit through tsc: %v", err)
	}
	t.Logf("permit through tsc after %v (fence %d); the stalled holder (fence %d) lost after %v: %v", got.Sub(start).Round(time.Millisecond),
		pc.Fence(), held.Fence(), time.Unix(0, lost.at.Load()).Sub(start).Round(time.Millisecond), held.Err())
	lost.before(t, got, "the waiter on tsc held the slot")
	if pc.Fence() <= held.Fence() {
		t.Errorf("the waiter's fence %d is not above the stalled holder's %d", pc.Fence(), held.Fence())
	}
	px.Resume()
	_ = pc.Release(ctx)
}

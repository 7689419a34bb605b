package amqpsem_test

import (
	"log/slog"
	neturl "net/url"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

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

// TestClusterClaimSurvivesNodeLoss: a slot's claim queue lives on the node
// it was first declared through. When that node dies, the broker drops the
// queue and cancels the claim of a holder connected elsewhere, whose token
// (in the replicated token queue) and connection are fine. The holder must
// keep its permit and claim the slot again, so that a reconcile sees the
// slot held and issues no second token for it.
func TestClusterClaimSurvivesNodeLoss(t *testing.T) {
	c := rabbittest.NeedCluster(t)
	ctx := semtest.Context(t, 2*time.Minute)
	n := name(t)
	// Made through tsa: the configuration and token queues are led there.
	viaA, err := amqpsem.Init(ctx, dialNode(t, c, "tsa"), n, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer viaA.Close()
	// Quorum queues left behind slow every later restart of the nodes.
	defer func() { _ = amqpsem.ForceDelete(semtest.Context(t, time.Minute), dialNode(t, c, "tsb"), n) }()
	p, err := viaA.Acquire(ctx) // declares slot 0's claim queue on tsa
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
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

	if err := c.Kill("tsa"); err != nil {
		t.Fatal(err)
	}
	raw, err := amqp.Dial(c.URL("tsc"))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	claimQ := "tokensem." + n + ".claim.0"
	deadline := time.Now().Add(20 * time.Second)
	for {
		ch, err := raw.Channel()
		if err != nil {
			t.Fatal(err)
		}
		q, err := ch.QueueDeclarePassive(claimQ, false, false, false, false, nil)
		_ = ch.Close()
		if err == nil && q.Consumers == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("slot 0 not claimed again after its claim queue's node died: %+v, %v; holder: %v; its log:\n%s", q, err, held.Err(), log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	select {
	case <-held.Done():
		t.Fatalf("the holder on tsb lost its permit with tsa: %v", held.Err())
	default:
	}
	viaC, err := amqpsem.Open(ctx, dialNode(t, c, "tsc"), n)
	if err != nil {
		t.Fatalf("open through tsc with tsa down: %v", err)
	}
	defer viaC.Close()
	rep, err := reconciler.Run(ctx, viaC.Inventory(), true)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Issued != 0 || len(rep.Missing) != 0 {
		t.Fatalf("reconcile with the slot claimed again: %+v; want nothing missing or issued", rep)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatalf("release through tsb: %v", err)
	}
}

// TestClusterStalledHolderNodeLoss: a holder connected to tsb through a
// link that stalls; its slot's claim queue lives on tsa, which is killed. A
// waiter on tsc that repairs orphans must not hold the slot while the
// stalled holder still holds its permit.
func TestClusterStalledHolderNodeLoss(t *testing.T) {
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

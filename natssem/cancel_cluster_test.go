package natssem_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/natstest"
	"github.com/tokensem/tokensem/internal/semtest"
	"github.com/tokensem/tokensem/natssem"
)

// TestClusterCancelledWaiterStrandsNothing: a waiter connected to one node
// gives up just as a release's token is handed to it by the consumer's
// leader on another node. Its node may already have dropped its inbox while
// the leader still counts it (the route's unsubscribe and the delivery cross
// on the wire): a token delivered then is lost to everyone until the
// server's ack wait, a whole lease. The next waiter must get it at once.
func TestClusterCancelledWaiterStrandsNothing(t *testing.T) {
	const (
		lease  = 30 * time.Second
		trials = 200
	)
	c := cluster(t)
	ctx := semtest.Context(t, 4*time.Minute)
	name := fmt.Sprintf("cancel-strand-%d", time.Now().UnixNano())
	admin, err := natssem.Init(ctx, connectCluster(t, 0), name, 1, natssem.WithReplicas(3), natssem.WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	js, err := jetstream.New(connectCluster(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	cons, err := js.Consumer(ctx, natssem.StreamName(name), "holders")
	if err != nil {
		t.Fatal(err)
	}
	leader := -1
	for i := range c.Size() {
		if ci := cons.CachedInfo(); ci.Cluster != nil && ci.Cluster.Leader == natstest.ServerName(i) {
			leader = i
		}
	}
	if leader < 0 {
		t.Fatalf("consumer leader unknown: %+v", cons.CachedInfo().Cluster)
	}
	open := func(node int) *natssem.Semaphore {
		s, err := natssem.Open(ctx, connectCluster(t, node), name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	// The holder talks to the leader, so its Nak reaches it first; the
	// waiter that gives up is on another node.
	holder, quitter, next := open(leader), open((leader+1)%3), open((leader+2)%3)
	waiting := func(n int) func() bool {
		return func() bool {
			info, err := cons.Info(ctx)
			return err == nil && info.NumWaiting >= n
		}
	}

	wins := 0
	defer func() { t.Logf("the quitter took the token before it gave up in %d of %d trials", wins, trials) }()
	for trial := range trials {
		held, err := holder.Acquire(semtest.Context(t, 10*time.Second))
		if err != nil {
			t.Fatalf("trial %d: holder: %v", trial, err)
		}
		qctx, quit := context.WithCancel(ctx)
		qdone := make(chan tokensem.Permit, 1)
		go func() {
			p, _ := quitter.Acquire(qctx)
			qdone <- p
		}()
		waitFor(t, "quitter queued", waiting(1))
		ndone := make(chan error, 1)
		var got tokensem.Permit
		go func() {
			// Well under the lease: a stranded token fails this.
			p, err := next.Acquire(semtest.Context(t, 5*time.Second))
			got = p
			ndone <- err
		}()
		waitFor(t, "next waiter queued", waiting(2))

		nak, err := natssem.SplitRelease(ctx, held)
		if err != nil {
			t.Fatalf("trial %d: release: %v", trial, err)
		}
		// The delivery to the quitter's pull and its give-up race: the Nak
		// goes first, the give-up follows at a growing distance (0 to 980
		// µs), so that some trials cross the moment the token reaches
		// the quitter's node.
		gap := time.Duration(trial%50) * 20 * time.Microsecond
		if err := nak(); err != nil {
			t.Fatal(err)
		}
		spin(gap)
		quit()
		if p := <-qdone; p != nil {
			wins++
			// The quitter saw the token before its cancel: no race this
			// time; hand it on.
			if err := p.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if err := <-ndone; err != nil {
			info, _ := cons.Info(ctx)
			var pending string
			if info != nil {
				pending = fmt.Sprintf("ack pending %d, redelivered %d, waiting %d", info.NumAckPending, info.NumRedelivered, info.NumWaiting)
			}
			if errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("trial %d (give-up %v after the Nak): the released token never reached the next waiter (%s)", trial, gap, pending)
			}
			t.Fatalf("trial %d: next waiter: %v", trial, err)
		}
		if err := got.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// spin waits d without sleeping (a sleep this short oversleeps).
func spin(d time.Duration) {
	for t0 := time.Now(); time.Since(t0) < d; {
	}
}

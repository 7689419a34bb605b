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
	t.Parallel()
	const (
		lease  = 30 * time.Second
		trials = 200
	)
	c := cluster(t)
	ctx := semtest.Context(t, 4*time.Minute)
	name := fmt.Sprintf("cancel-strand-%d", time.Now().UnixNano())
	cons := initClusterOfOne(ctx, t, name, natssem.WithLease(lease))
	leader := -1
	for i := range c.Size() {
		if ci := cons.CachedInfo(); ci.Cluster != nil && ci.Cluster.Leader == natstest.ServerName(i) {
			leader = i
		}
	}
	if leader < 0 {
		t.Fatalf("consumer leader unknown: %+v", cons.CachedInfo().Cluster)
	}
	// The holder talks to the leader, so its Nak reaches it first; the
	// waiter that gives up is on another node.
	holder, quitter, next := openOn(ctx, t, leader, name), openOn(ctx, t, (leader+1)%3, name), openOn(ctx, t, (leader+2)%3, name)
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

// TestClusterGivenUpPullIsTakenOver: on a cluster a caller that gives up
// keeps its inbox until its queued pull ends (see
// TestClusterCancelledWaiterStrandsNothing), and the next caller of the
// same Semaphore takes that pull over. A caller that times out and retries
// keeps one pull queued, not one per try, so a waiter limit of one still
// lets it wait; and a token its own release sends to such a pull comes
// back to the queue (TryAcquire takes it within a second).
func TestClusterGivenUpPullIsTakenOver(t *testing.T) {
	t.Parallel()
	ctx := semtest.Context(t, 2*time.Minute)
	name := fmt.Sprintf("taken-over-%d", time.Now().UnixNano())
	cons := initClusterOfOne(ctx, t, name, natssem.WithMaxWaiters(1))
	waiting := func() int {
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.NumWaiting
	}
	s := openOn(ctx, t, 1, name)

	for round := range 3 {
		held, err := s.Acquire(semtest.Context(t, 10*time.Second))
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		for try := range 10 {
			_, err := s.Acquire(semtest.Context(t, 30*time.Millisecond))
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("round %d, try %d: %v, want a timeout", round, try, err)
			}
		}
		if n := waiting(); n != 1 {
			t.Fatalf("round %d: %d pulls queued after ten timed-out tries, want the one taken over each time", round, n)
		}
		if round == 0 {
			// A caller that waits now is served (the limit is one), at
			// once: not after its own pull, refused while the given-up
			// one is queued, is found lost (1.5 heartbeats, 7.5 s).
			got := make(chan error, 1)
			go func() {
				p, err := s.Acquire(semtest.Context(t, 3*time.Second))
				if err == nil {
					err = p.Release(ctx)
				}
				got <- err
			}()
			time.Sleep(50 * time.Millisecond)
			if err := held.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-got; err != nil {
				t.Fatalf("the waiting caller: %v", err)
			}
			continue
		}
		// The release's token goes to the queued pull first, whose waiter
		// hands it back: a TryAcquire meanwhile may miss it (as with any
		// caller waiting), but it must not be stranded.
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		var p tokensem.Permit
		for tries := 0; p == nil; tries++ {
			p, err = s.TryAcquire(ctx)
			switch {
			case errors.Is(err, tokensem.ErrNoPermit) && tries < 100:
				time.Sleep(10 * time.Millisecond)
			case err != nil:
				t.Fatalf("round %d: TryAcquire after the release (try %d): %v", round, tries, err)
			}
		}
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestClusterDroppedPullIsNotTakenOver: a pull the server dropped without a
// word (the waiter queue was full) is still counted by its waiter; once it
// has been silent past its first heartbeat the next caller must not take it
// over, but ask anew. Otherwise every caller would wait 1.5 heartbeats for
// a pull that does not exist, and one with a shorter deadline would never
// ask at all.
func TestClusterDroppedPullIsNotTakenOver(t *testing.T) {
	t.Parallel()
	ctx := semtest.Context(t, 2*time.Minute)
	name := fmt.Sprintf("dropped-pull-%d", time.Now().UnixNano())
	cons := initClusterOfOne(ctx, t, name, natssem.WithMaxWaiters(1))
	holder, other := openOn(ctx, t, 0, name), openOn(ctx, t, 2, name)
	s := openOn(ctx, t, 1, name, natssem.WithPullHeartbeat(time.Second))
	waiting := func(n int) func() bool {
		return func() bool {
			info, err := cons.Info(ctx)
			return err == nil && info.NumWaiting == n
		}
	}
	held, err := holder.Acquire(semtest.Context(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	octx, quit := context.WithCancel(ctx)
	odone := make(chan struct{})
	go func() {
		defer close(odone)
		if p, err := other.Acquire(octx); err == nil {
			_ = p.Release(ctx)
		}
	}()
	waitFor(t, "the queue full", waiting(1))
	// The server drops this pull (the queue is full); the caller learns it
	// after 1.5 heartbeats.
	if _, err := s.Acquire(semtest.Context(t, 10*time.Second)); !errors.Is(err, tokensem.ErrTooManyWaiters) {
		t.Fatalf("Acquire with the queue full: %v, want ErrTooManyWaiters", err)
	}
	quit()
	<-odone
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the queue empty", waiting(0))
	// Shorter than 1.5 heartbeats: only a fresh pull gets the permit.
	p, err := s.Acquire(semtest.Context(t, time.Second))
	if err != nil {
		t.Fatalf("Acquire with the permit free and nobody waiting: %v", err)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// initClusterOfOne creates an R3 semaphore of one permit on the cluster and
// returns its holders consumer, to read the server's count of waiters.
func initClusterOfOne(ctx context.Context, t *testing.T, name string, opts ...natssem.Option) jetstream.Consumer {
	t.Helper()
	admin, err := natssem.Init(ctx, connectCluster(t, 0), name, 1, append(opts, natssem.WithReplicas(3))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close() })
	js, err := jetstream.New(connectCluster(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	cons, err := js.Consumer(ctx, natssem.ResourcesOf(name, "").Stream, "holders")
	if err != nil {
		t.Fatal(err)
	}
	return cons
}

// openOn opens semaphore name through a connection that prefers node.
func openOn(ctx context.Context, t *testing.T, node int, name string, opts ...natssem.Option) *natssem.Semaphore {
	t.Helper()
	s, err := natssem.Open(ctx, connectCluster(t, node), name, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// spin waits d without sleeping (a sleep this short oversleeps).
func spin(d time.Duration) {
	for t0 := time.Now(); time.Since(t0) < d; {
	}
}

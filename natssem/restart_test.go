package natssem_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokensem/tokensem/internal/semtest"
	"github.com/tokensem/tokensem/natssem"
	"github.com/tokensem/tokensem/natssem/embedded"
)

// TestWaiterAcrossRestart restarts the server on its store while a caller
// waits. The pull it had queued died with the server; it must pull again as
// soon as its connection is back, not after missing heartbeats, and get the
// permit released after the restart.
func TestWaiterAcrossRestart(t *testing.T) { testWaiterAcrossRestart(t) }

// TestWaiterAcrossRestartGroup is TestWaiterAcrossRestart on a key of a
// group (a consumer of its own on the group's stream).
func TestWaiterAcrossRestartGroup(t *testing.T) {
	testWaiterAcrossRestart(t, natssem.WithGroup("restart"))
}

func testWaiterAcrossRestart(t *testing.T, layout ...natssem.Option) {
	const heartbeat = 5 * time.Second
	store := t.TempDir()
	s1, err := embedded.Start(embedded.Config{StoreDir: store})
	if err != nil {
		t.Fatal(err)
	}
	addr := s1.Addr().String()
	restarted := false
	defer func() {
		if !restarted {
			s1.Shutdown()
		}
	}()
	conn := func() *nats.Conn {
		nc, err := nats.Connect(s1.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	ctx := semtest.Context(t, time.Minute)
	const lease = 4 * time.Second
	holder, err := natssem.Init(ctx, conn(), "restart", 1, append(layout, natssem.WithLease(lease), natssem.WithPullHeartbeat(heartbeat))...)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	waiter, err := natssem.Open(ctx, conn(), "restart", append(layout, natssem.WithPullHeartbeat(heartbeat))...)
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Close()
	p, err := holder.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		q, err := waiter.Acquire(ctx)
		if err == nil {
			err = q.Release(ctx)
		}
		got <- err
	}()
	time.Sleep(200 * time.Millisecond) // the waiter's pull is queued

	s1.Shutdown()
	restarted = true
	s2, err := embedded.Start(embedded.Config{Listen: addr, StoreDir: store})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Shutdown()
	// A client that opens the semaphore now finds it whole.
	if _, err := natssem.Open(ctx, conn(), "restart", layout...); err != nil {
		t.Fatalf("open after the restart: %v", err)
	}
	// The holder keeps its permit across the restart (it renews every
	// lease/3), and nobody else gets the slot meanwhile.
	select {
	case err := <-got:
		t.Fatalf("the waiter's Acquire returned while the holder held the only permit (err %v)", err)
	case <-p.Done():
		t.Fatalf("the holder lost its permit across the restart: %v", p.Err())
	case <-time.After(lease / 2):
	}
	if err := p.Release(ctx); err != nil {
		t.Fatalf("release after the restart: %v", err)
	}
	released := time.Now()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("waiter served %v after the release", time.Since(released).Round(time.Millisecond))
	case <-time.After(heartbeat):
		t.Fatalf("waiter not served within a heartbeat (%v) of a release after the restart: its lost pull went unnoticed", heartbeat)
	}
}

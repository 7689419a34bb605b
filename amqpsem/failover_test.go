package amqpsem_test

import (
	"errors"
	"testing"
	"time"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/amqpsem"
	"github.com/tokensem/tokensem/internal/faultproxy"
	"github.com/tokensem/tokensem/internal/freeport"
	"github.com/tokensem/tokensem/internal/semtest"
)

// deadAddr returns a loopback address nothing listens on (outside the
// ephemeral range, so that no ":0" listener of another test gets it).
func deadAddr(t *testing.T) string {
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// TestDialList: Dial takes a comma-separated list of a cluster's nodes and
// connects to the first that answers; when none does, the error says so
// for each.
func TestDialList(t *testing.T) {
	ctx := semtest.Context(t, 30*time.Second)
	dead := broker.URLVia(deadAddr(t))
	c, err := amqpsem.Dial(ctx, dead+","+broker.URL)
	if err != nil {
		t.Fatalf("dial with one dead node first: %v", err)
	}
	_ = c.Close()
	_, err = amqpsem.Dial(ctx, dead+","+broker.URLVia(deadAddr(t)))
	if !errors.Is(err, amqpsem.ErrUnreachable) || !errors.Is(err, tokensem.ErrUnavailable) {
		t.Fatalf("dial with every node dead: %v; want ErrUnreachable and ErrUnavailable", err)
	}
}

// TestWaiterFailsOver: a caller waits through node A of a two-node list
// (two proxies in front of one broker stand for two nodes). A goes away for
// good; the caller must go on waiting through B and get the permit that a
// holder elsewhere releases, while a permit held through A is lost.
func TestWaiterFailsOver(t *testing.T) {
	ctx := semtest.Context(t, time.Minute)
	n := name(t)
	admin := initAMQP(t, n, 2)
	a, err := faultproxy.New(broker.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := faultproxy.New(broker.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	c, err := amqpsem.Dial(ctx, broker.URLVia(a.Addr())+","+broker.URLVia(b.Addr()), amqpsem.WithHeartbeat(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := amqpsem.Open(ctx, c, n)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	heldViaA, err := s.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	other, err := admin.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		p, err := s.Acquire(ctx)
		if err == nil {
			err = p.Release(ctx)
		}
		got <- err
	}()
	time.Sleep(200 * time.Millisecond) // the caller waits through A
	_ = a.Close()                      // node A is gone for good
	select {
	case <-heldViaA.Done():
		if !errors.Is(heldViaA.Err(), tokensem.ErrLeaseLost) {
			t.Errorf("permit held through the lost node: Err = %v", heldViaA.Err())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a permit held through the lost node was not reported lost")
	}
	if err := other.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("the waiter did not fail over: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the waiter was not served through the other node")
	}
}

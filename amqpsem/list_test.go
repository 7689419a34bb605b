package amqpsem_test

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/amqpsem"
	"github.com/tokensem/tokensem/internal/semtest"
)

// TestListPastTwoThousandEntries: a quorum queue gives a consumer without
// a prefetch limit at most 2,000 unacked messages, and the registry's
// reader keeps every entry unacked until it is done. With more entries
// than that, List missed the newest semaphores. Here 2,100 old junk
// entries (which List drops) stand before a new semaphore's.
func TestListPastTwoThousandEntries(t *testing.T) {
	p := ownPlace(t)
	bodies := make([][]byte, 2100)
	for i := range bodies {
		bodies[i] = []byte(`{"name":""}`)
	}
	p.fillRegistry(t, time.Now().Add(-time.Hour), bodies...)
	n := name(t)
	p.init(t, n, 1)
	infos, err := amqpsem.List(semtest.Context(t, time.Minute), p.dial(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range infos {
		if in.Name == n {
			return
		}
	}
	t.Fatalf("List of %d semaphores misses %s, registered after 2,100 other entries", len(infos), n)
}

// TestListWaitsForEntriesPutBack: a reader puts the registry entries it
// keeps back by closing its channel (or by dying), and the queue takes
// them back a moment later, maybe after the registry's lock is free. A
// List that counted the entries before then read too few and missed a
// semaphore whose Init had returned. Here an earlier reader still holds
// every entry until half a second after the List took the registry's lock.
func TestListWaitsForEntriesPutBack(t *testing.T) {
	p := ownPlace(t)
	n := name(t)
	p.init(t, n, 1)
	ch := p.channel(t)
	if err := ch.Qos(math.MaxUint16, 0, false); err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume("tokensem..registry", "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for held := false; !held; {
		select {
		case d := <-deliveries:
			held = strings.Contains(string(d.Body), `"`+n+`"`)
		case <-time.After(10 * time.Second):
			t.Fatalf("the registry delivered no entry for %s", n)
		}
	}
	listing := make(chan struct{})
	released := make(chan bool, 1)
	go func() {
		locked := p.registryLocked(t, listing)
		if locked {
			time.Sleep(500 * time.Millisecond)
		}
		_ = ch.Close() // puts every entry back
		released <- locked
	}()
	infos, err := amqpsem.List(semtest.Context(t, time.Minute), p.dial(t))
	close(listing)
	if !<-released {
		t.Fatal("the List never held the registry's lock while the entries were held")
	}
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(infos, func(in tokensem.Info) bool { return in.Name == n }) {
		t.Fatalf("List of %d semaphores misses %s, whose entry an earlier reader held when it began", len(infos), n)
	}
}

// registryLocked waits until, in p, a connection holds the registry's lock (an
// exclusive queue: a passive declare from another connection is refused
// with 405), and reports whether one did before done was closed.
func (p place) registryLocked(t *testing.T, done <-chan struct{}) bool {
	conn, err := amqp.Dial(string(p))
	if err != nil {
		t.Error(err)
		return false
	}
	defer conn.Close()
	for {
		ch, err := conn.Channel()
		if err != nil {
			t.Error(err)
			return false
		}
		_, err = ch.QueueDeclarePassive("tokensem..registry.lock", false, false, true, false, nil)
		_ = ch.Close()
		if e := (*amqp.Error)(nil); errors.As(err, &e) && e.Code == amqp.ResourceLocked {
			return true
		}
		select {
		case <-done:
			return false
		case <-time.After(5 * time.Millisecond):
		}
	}
}

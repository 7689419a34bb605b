package amqpsem_test

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem/amqpsem"
	"github.com/tokensem/tokensem/internal/semtest"
)

// TestListPastTwoThousandEntries: a quorum queue gives a consumer without
// a prefetch limit at most 2,000 unacked messages, and the registry's
// reader keeps every entry unacked until it is done. With more entries
// than that, List missed the newest semaphores. Here 2,100 old junk
// entries (which List drops) stand before a new semaphore's.
func TestListPastTwoThousandEntries(t *testing.T) {
	ch := rawChannel(t)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	var last *amqp.DeferredConfirmation
	var err error
	for range 2100 {
		if last, err = ch.PublishWithDeferredConfirmWithContext(t.Context(), "", "tokensem..registry", true, false,
			amqp.Publishing{DeliveryMode: amqp.Persistent, Timestamp: old, Body: []byte(`{"name":""}`)}); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := last.WaitContext(t.Context()); !ok || err != nil {
		t.Fatalf("junk entries confirmed %v: %v", ok, err)
	}
	n := name(t)
	initAMQP(t, n, 1)
	infos, err := amqpsem.List(semtest.Context(t, time.Minute), dial(t, broker.Addr, 0))
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

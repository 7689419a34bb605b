package amqpsem

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem/internal/rabbittest"
)

// TestTokensOutDistrustsAnEmptyAnswer: RabbitMQ answers a quorum queue's
// count it could not take (its leader lost, or busy for 250 ms) with 0
// ready and 0 consumers. A repair that read that answer as "nobody holds a
// token" issued a slot's token while its holder, cut off from the broker,
// still believed it held it. The same answer from a token queue that is
// really empty (purged here) must read as "a token may be out"; one with a
// token ready and no consumer as "none is".
func TestTokensOutDistrustsAnEmptyAnswer(t *testing.T) {
	t.Parallel() // its ForceDelete waits W: no token is ready
	b := rabbittest.Need(t)
	ctx := t.Context()
	c, err := Dial(ctx, b.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	name := "tokens-out-" + time.Now().Format("150405_000000")
	s, err := Init(ctx, c, name, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ForceDelete(ctx, c, name) }()
	defer s.Close()
	cfg := s.config()
	if out, err := s.tokensOut(ctx, cfg); err != nil || out {
		t.Fatalf("one token ready, no consumer: tokensOut = %v, %v; want false", out, err)
	}
	conn, err := amqp.Dial(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueuePurge(tokenQueue(name), false); err != nil {
		t.Fatal(err)
	}
	if out, err := s.tokensOut(ctx, cfg); err != nil || !out {
		t.Fatalf("0 ready, 0 consumers (the answer of a count not taken): tokensOut = %v, %v; want true", out, err)
	}
}

// TestAskerAloneNeedsARealAnswer: a queue's counts, taken while the reader
// asking consumes it, say "every message is handed to the asker" (for the
// configuration read: there is none) only when they count that reader and
// nothing ready. RabbitMQ's answer when it could not count (0 and 0) read
// as "no message" made a semaphore whose token queue was gone (a Delete
// waiting out W) "not initialized", and a retried Delete removed its
// configuration at once.
func TestAskerAloneNeedsARealAnswer(t *testing.T) {
	for _, tc := range []struct {
		ready, consumers int
		want             bool
	}{
		{0, 0, false}, // no answer
		{0, 1, true},  // only the asker: there is none
		{0, 2, false}, // another reader holds it
		{1, 1, false}, // it just came back
	} {
		if got := askerAlone(amqp.Queue{Messages: tc.ready, Consumers: tc.consumers}); got != tc.want {
			t.Errorf("ready %d, consumers %d: askerAlone = %v, want %v", tc.ready, tc.consumers, got, tc.want)
		}
	}
}

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

// TestOneEmptyLookIsNotUninitialized: a configuration queue that looks
// empty and unheld with no token queue beside it is "not initialized" only
// if it stays so: RabbitMQ answers a count it could not take with 0 and 0,
// and a "deleting" configuration outlives its token queue. Here the
// configuration is taken out and put back a second later; the read must
// find it, not say "not initialized" (which made Delete remove the
// configuration at once, and Init make a new life).
func TestOneEmptyLookIsNotUninitialized(t *testing.T) {
	t.Parallel()
	b := rabbittest.Need(t)
	ctx := t.Context()
	c, err := Dial(ctx, b.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	name := "empty-look-" + time.Now().Format("150405_000000")
	s, err := Init(ctx, c, name, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ForceDelete(ctx, c, name) }()
	defer s.Close()
	conn, err := amqp.Dial(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	d, ok, err := ch.Get(configQueue(name), false)
	if err != nil || !ok {
		t.Fatalf("taking the configuration: %v, %v", ok, err)
	}
	if err := d.Ack(false); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDelete(tokenQueue(name), false, false, false); err != nil {
		t.Fatal(err)
	}
	back := make(chan error, 1)
	go func() {
		time.Sleep(time.Second)
		back <- ch.PublishWithContext(ctx, "", configQueue(name), false, false,
			amqp.Publishing{DeliveryMode: amqp.Persistent, ContentType: d.ContentType, Body: d.Body})
	}()
	cfg, err := s.loadConfig(ctx)
	if err := <-back; err != nil {
		t.Fatal(err)
	}
	if err != nil {
		t.Fatalf("configuration away for a second: %v; want it read once back", err)
	}
	if cfg.Permits != 1 {
		t.Fatalf("read back %+v", cfg)
	}
}

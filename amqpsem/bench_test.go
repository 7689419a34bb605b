package amqpsem_test

import (
	"context"
	"fmt"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem/amqpsem"
	"github.com/tokensem/tokensem/driver"
	"github.com/tokensem/tokensem/internal/benchtest"
)

func benchSem(b *testing.B, n string, create bool) *amqpsem.Semaphore {
	b.Helper()
	c := dial(b, broker.Addr, 0)
	var s *amqpsem.Semaphore
	var err error
	if create {
		s, err = amqpsem.Init(context.Background(), c, n, 1)
	} else {
		s, err = amqpsem.Open(context.Background(), c, n)
	}
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	return s
}

// BenchmarkCycle is one client's Acquire+Release on RabbitMQ.
func BenchmarkCycle(b *testing.B) {
	benchtest.BenchCycle(b, benchSem(b, "bench-cycle-"+driver.NewToken("x", 0, 0).ID[:6], true))
}

// BenchmarkHandoff measures release → a waiter blocked on another
// connection holding the permit.
func BenchmarkHandoff(b *testing.B) {
	n := "bench-handoff-" + driver.NewToken("x", 0, 0).ID[:6]
	a, w := benchSem(b, n, true), benchSem(b, n, false)
	probe, err := amqp.Dial(broker.URL)
	if err != nil {
		b.Fatal(err)
	}
	defer probe.Close()
	pch, err := probe.Channel()
	if err != nil {
		b.Fatal(err)
	}
	consumers := func() int {
		q, err := pch.QueueDeclarePassive(amqpsem.ResourcesOf(n).Queue, true, false, false, false, nil)
		if err != nil {
			b.Fatal(err)
		}
		return q.Consumers
	}
	// A quorum queue counts the holder as a consumer: the waiter is queued
	// once the count, settled at the holder alone, reaches two.
	benchtest.BenchHandoff(b, a, w,
		func() bool { return consumers() == 1 },
		func() bool { return consumers() >= 2 })
}

// BenchmarkWeighted compares holding k of 4 permits with AcquireN against
// k single Acquire calls in a row.
func BenchmarkWeighted(b *testing.B) {
	c := dial(b, broker.Addr, 0)
	s, err := amqpsem.Init(context.Background(), c, "bench-weighted-"+driver.NewToken("x", 0, 0).ID[:6], 4)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	for _, k := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("AcquireN-%d", k), func(b *testing.B) { benchtest.BenchWeighted(b, s, k, false) })
		b.Run(fmt.Sprintf("singles-%d", k), func(b *testing.B) { benchtest.BenchWeighted(b, s, k, true) })
	}
}

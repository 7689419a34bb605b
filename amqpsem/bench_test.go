package amqpsem_test

import (
	"context"
	"slices"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/amqpsem"
)

func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[int(float64(len(s)-1)*p)]
}

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
	ctx := context.Background()
	s := benchSem(b, "bench-cycle-"+tokensem.NewToken("x", 0, 0).ID[:6], true)
	var d []time.Duration
	for b.Loop() {
		t0 := time.Now()
		p, err := s.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := p.Release(ctx); err != nil {
			b.Fatal(err)
		}
		d = append(d, time.Since(t0))
	}
	b.ReportMetric(float64(percentile(d, 0.5).Microseconds()), "p50-µs")
	b.ReportMetric(float64(percentile(d, 0.99).Microseconds()), "p99-µs")
}

// BenchmarkHandoff measures release → a waiter blocked on another
// connection holding the permit.
func BenchmarkHandoff(b *testing.B) {
	ctx := context.Background()
	n := "bench-handoff-" + tokensem.NewToken("x", 0, 0).ID[:6]
	a := benchSem(b, n, true)
	w := benchSem(b, n, false)
	probe, err := amqp.Dial(broker.URL)
	if err != nil {
		b.Fatal(err)
	}
	defer probe.Close()
	pch, err := probe.Channel()
	if err != nil {
		b.Fatal(err)
	}
	type got struct {
		p  tokensem.Permit
		at time.Time
	}
	var d []time.Duration
	for b.Loop() {
		b.StopTimer()
		held, err := a.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		ch := make(chan got, 1)
		go func() {
			p, err := w.Acquire(ctx)
			if err != nil {
				b.Error(err)
			}
			ch <- got{p, time.Now()}
		}()
		for { // until the waiter's consumer is registered
			q, err := pch.QueueDeclarePassive(amqpsem.QueueName(n), true, false, false, false, nil)
			if err != nil {
				b.Fatal(err)
			}
			if q.Consumers >= 1 {
				break
			}
			time.Sleep(100 * time.Microsecond)
		}
		b.StartTimer()
		t0 := time.Now()
		if err := held.Release(ctx); err != nil {
			b.Fatal(err)
		}
		g := <-ch
		d = append(d, g.at.Sub(t0))
		b.StopTimer()
		if g.p != nil {
			_ = g.p.Release(ctx)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(percentile(d, 0.5).Microseconds()), "p50-µs")
	b.ReportMetric(float64(percentile(d, 0.99).Microseconds()), "p99-µs")
}

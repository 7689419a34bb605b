package natssem_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/natssem"
)

// rawRTT measures core-NATS request-reply round trips between two
// connections to the same server (a requester and a responder), the
// reference the targets are stated against. It returns the median.
func rawRTT(b *testing.B, n int) time.Duration {
	b.Helper()
	req, resp := connect(b, srv.Addr().String()), connect(b, srv.Addr().String())
	sub, err := resp.Subscribe("bench.rtt", func(m *nats.Msg) { _ = m.Respond(m.Data) })
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := resp.Flush(); err != nil {
		b.Fatal(err)
	}
	d := make([]time.Duration, n)
	for i := range d {
		t0 := time.Now()
		if _, err := req.Request("bench.rtt", []byte("x"), 5*time.Second); err != nil {
			b.Fatal(err)
		}
		d[i] = time.Since(t0)
	}
	slices.Sort(d)
	return d[n/2]
}

func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[int(float64(len(s)-1)*p)]
}

// BenchmarkRawRequestReply is the core-NATS round trip on its own.
func BenchmarkRawRequestReply(b *testing.B) {
	req, resp := connect(b, srv.Addr().String()), connect(b, srv.Addr().String())
	sub, err := resp.Subscribe("bench.raw", func(m *nats.Msg) { _ = m.Respond(m.Data) })
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	_ = resp.Flush()
	for b.Loop() {
		if _, err := req.Request("bench.raw", []byte("x"), 5*time.Second); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCycle is one client's Acquire+Release. It also reports the
// median raw round trip measured in the same run and the ratio.
func BenchmarkCycle(b *testing.B) {
	nc := connect(b, srv.Addr().String())
	ctx := context.Background()
	s, err := natssem.Init(ctx, nc, "bench-cycle", 1)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	rtt := rawRTT(b, 2000)
	var d []time.Duration
	var acq time.Duration
	for b.Loop() {
		t0 := time.Now()
		p, err := s.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		acq += time.Since(t0)
		if err := p.Release(ctx); err != nil {
			b.Fatal(err)
		}
		d = append(d, time.Since(t0))
	}
	b.ReportMetric(float64(acq.Microseconds())/float64(len(d)), "acquire-µs")
	p50 := percentile(d, 0.5)
	b.ReportMetric(float64(p50.Microseconds()), "p50-µs")
	b.ReportMetric(float64(percentile(d, 0.99).Microseconds()), "p99-µs")
	b.ReportMetric(float64(rtt.Microseconds()), "raw-rtt-µs")
	b.ReportMetric(float64(p50)/float64(rtt), "p50/rtt")
}

// BenchmarkHandoff measures release → blocked waiter: the time from a
// holder calling Release until a waiter on another connection holds the
// permit.
func BenchmarkHandoff(b *testing.B) {
	ctx := context.Background()
	holderConn, waiterConn := connect(b, srv.Addr().String()), connect(b, srv.Addr().String())
	a, err := natssem.Init(ctx, holderConn, "bench-handoff", 1)
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
	w, err := natssem.Open(ctx, waiterConn, "bench-handoff")
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	js, err := jetstream.New(holderConn)
	if err != nil {
		b.Fatal(err)
	}
	consumer, err := js.Consumer(ctx, natssem.StreamName("bench-handoff"), "holders")
	if err != nil {
		b.Fatal(err)
	}
	var d []time.Duration
	type got struct {
		p  tokensem.Permit
		at time.Time
	}
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
		waitQueued(b, consumer, 1)
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

// waitQueued polls the consumer until n pull requests wait. It reads only
// consumer info: a full Status would create and delete a KV watcher, work
// the server would still be finishing inside the timed section.
func waitQueued(b *testing.B, c jetstream.Consumer, n int) {
	b.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		info, err := c.Info(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		if info.NumWaiting >= n {
			return
		}
		time.Sleep(100 * time.Microsecond)
	}
	b.Fatal("waiter never queued")
}

// BenchmarkPrimitives measures, in one run, the broker operations a cycle
// is made of, with plain nats.go: a KV compare-and-set (a JetStream publish
// with an expected revision) and a Nak followed by a one-message pull. The
// fenced cycle needs one pull and two compare-and-sets in sequence, so
// pull + 2×cas is its floor on this machine.
func BenchmarkPrimitives(b *testing.B) {
	ctx := context.Background()
	nc := connect(b, srv.Addr().String())
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "bench_prim", History: 1, Storage: jetstream.FileStorage})
	if err != nil {
		b.Fatal(err)
	}
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "BENCH_PRIM", Subjects: []string{"bench.prim"},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage})
	if err != nil {
		b.Fatal(err)
	}
	cons, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := js.Publish(ctx, "bench.prim", []byte("t")); err != nil {
		b.Fatal(err)
	}
	rtt := rawRTT(b, 2000)
	rev, err := kv.Put(ctx, "k", []byte("v"))
	if err != nil {
		b.Fatal(err)
	}
	var cas, pull []time.Duration
	var last jetstream.Msg
	for b.Loop() {
		t0 := time.Now()
		if rev, err = kv.Update(ctx, "k", []byte("v"), rev); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if last != nil {
			_ = last.Nak()
		}
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			b.Fatal(err)
		}
		for m := range batch.Messages() {
			last = m
		}
		t2 := time.Now()
		cas, pull = append(cas, t1.Sub(t0)), append(pull, t2.Sub(t1))
	}
	c50, p50 := percentile(cas, 0.5), percentile(pull, 0.5)
	b.ReportMetric(float64(rtt.Microseconds()), "raw-rtt-µs")
	b.ReportMetric(float64(c50.Microseconds()), "cas-p50-µs")
	b.ReportMetric(float64(p50.Microseconds()), "nak+pull-p50-µs")
	b.ReportMetric(float64(p50+2*c50)/float64(rtt), "floor/rtt")
}

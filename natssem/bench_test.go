package natssem_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem/internal/benchtest"
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
	s, err := natssem.Init(context.Background(), connect(b, srv.Addr().String()), "bench-cycle", 1)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	rtt := rawRTT(b, 2000)
	p50 := benchtest.BenchCycle(b, s)
	b.ReportMetric(float64(rtt.Microseconds()), "raw-rtt-µs")
	b.ReportMetric(float64(p50)/float64(rtt), "p50/rtt")
}

// handoffPair makes semaphore name of one permit with a holder's handle
// and a waiter's, each on a connection of its own, and the token
// consumer as a third connection sees it (to tell when the waiter is
// queued). The handles close with the benchmark.
func handoffPair(b *testing.B, name string) (holder, waiter *natssem.Semaphore, js jetstream.JetStream, consumer jetstream.Consumer) {
	ctx := context.Background()
	holder, err := natssem.Init(ctx, connect(b, srv.Addr().String()), name, 1)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = holder.Close() })
	waiter, err = natssem.Open(ctx, connect(b, srv.Addr().String()), name)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = waiter.Close() })
	if js, err = jetstream.New(connect(b, srv.Addr().String())); err != nil {
		b.Fatal(err)
	}
	if consumer, err = js.Consumer(ctx, natssem.ResourcesOf(name, "").Stream, "holders"); err != nil {
		b.Fatal(err)
	}
	return holder, waiter, js, consumer
}

// BenchmarkHandoff measures release → a waiter blocked on another
// connection holding the permit.
func BenchmarkHandoff(b *testing.B) {
	ctx := context.Background()
	a, w, _, consumer := handoffPair(b, "bench-handoff")
	// Consumer info only: a Status census would create and delete a KV
	// watcher, work the server would still be doing in the timed section.
	benchtest.BenchHandoff(b, a, w, nil, func() bool {
		info, err := consumer.Info(ctx)
		return err == nil && info.NumWaiting >= 1
	})
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
	c50, p50 := benchtest.Percentile(cas, 0.5), benchtest.Percentile(pull, 0.5)
	b.ReportMetric(float64(rtt.Microseconds()), "raw-rtt-µs")
	b.ReportMetric(float64(c50.Microseconds()), "cas-p50-µs")
	b.ReportMetric(float64(p50.Microseconds()), "nak+pull-p50-µs")
	b.ReportMetric(float64(p50+2*c50)/float64(rtt), "floor/rtt")
}

// BenchmarkWeighted compares holding k of 4 permits with AcquireN against
// k single Acquire calls in a row.
func BenchmarkWeighted(b *testing.B) {
	s, err := natssem.Init(context.Background(), connect(b, srv.Addr().String()), "bench-weighted", 4)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	for _, k := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("AcquireN-%d", k), func(b *testing.B) { benchtest.BenchWeighted(b, s, k, false) })
		b.Run(fmt.Sprintf("singles-%d", k), func(b *testing.B) { benchtest.BenchWeighted(b, s, k, true) })
	}
}

var groupKeys = flag.Int("groupkeys", 1000, "BenchmarkGroupKey: keys already in the group")

// BenchmarkGroupKey times Init and Delete of one key in a group that
// already holds -groupkeys keys (default 1,000; the set-up creates them,
// 4 at a time), each key with 2 permits. A work-queue stream checks a new
// consumer's filter against every other consumer's, so Init grows with the
// group (docs/notes/per-key-costs.md); Delete deletes the key's tokens one by one
// because a purge of more than one message recounts every consumer.
func BenchmarkGroupKey(b *testing.B) {
	nc := connect(b, srv.Addr().String())
	group := fmt.Sprintf("bench%d", time.Now().UnixNano())
	in := natssem.WithGroup(group)
	ctx := b.Context()
	sem := make(chan struct{}, 4)
	errs := make(chan error, *groupKeys)
	for i := range *groupKeys {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			s, err := natssem.Init(ctx, nc, fmt.Sprintf("k%d", i), 2, in)
			if err == nil {
				err = s.Close()
			}
			errs <- err
		}()
	}
	for range *groupKeys {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() {
		js, _ := jetstream.New(nc)
		cctx := context.WithoutCancel(ctx)
		_ = js.DeleteStream(cctx, natssem.ResourcesOf("", group).Stream)
		_ = js.DeleteKeyValue(cctx, natssem.ResourcesOf("", group).Bucket)
	})
	var inits, dels time.Duration
	i := 0
	for b.Loop() {
		name := fmt.Sprintf("new%d", i)
		i++
		t0 := time.Now()
		s, err := natssem.Init(ctx, nc, name, 2, in)
		if err != nil {
			b.Fatal(err)
		}
		_ = s.Close()
		t1 := time.Now()
		if err := natssem.Delete(ctx, nc, name, in); err != nil {
			b.Fatal(err)
		}
		inits += t1.Sub(t0)
		dels += time.Since(t1)
	}
	b.ReportMetric(float64(inits.Microseconds())/float64(i), "init-µs/op")
	b.ReportMetric(float64(dels.Microseconds())/float64(i), "delete-µs/op")
}

var netDelay = flag.Duration("netdelay", 100*time.Microsecond, "BenchmarkIdleCycle: one-way delay between client and server")

// BenchmarkIdleCycle is an acquire+release on a semaphore idle for longer
// than the configuration's TTL (2 s; per-key semaphores mostly are), its
// client connected through a proxy that delays every byte by -netdelay
// each way, as a network would. It reports the median of those cycles and
// of cycles back to back on one semaphore. Ten semaphores take turns, so
// each sample waits 210 ms: -benchtime 60x takes about 15 s.
func BenchmarkIdleCycle(b *testing.B) {
	ctx := context.Background()
	nc := connect(b, delayProxy(b, srv.Addr().String(), *netDelay))
	sems := make([]*natssem.Semaphore, 10)
	for i := range sems {
		s, err := natssem.Init(ctx, nc, fmt.Sprintf("bench-idle-%d", i), 1)
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		sems[i] = s
	}
	cycle := func(s *natssem.Semaphore) time.Duration {
		t0 := time.Now()
		p, err := s.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := p.Release(ctx); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	hot := make([]time.Duration, 200)
	for i := range hot {
		hot[i] = cycle(sems[0])
	}
	var idle []time.Duration
	gap := 2100 * time.Millisecond / time.Duration(len(sems))
	time.Sleep(2100 * time.Millisecond)
	i := 0
	for b.Loop() {
		time.Sleep(gap)
		idle = append(idle, cycle(sems[i%len(sems)]))
		i++
	}
	slices.Sort(hot)
	slices.Sort(idle)
	b.ReportMetric(float64(idle[len(idle)/2].Microseconds()), "idle-cycle-p50-µs")
	b.ReportMetric(float64(hot[len(hot)/2].Microseconds()), "hot-cycle-p50-µs")
}

// delayProxy forwards connections on a loopback port to target, each chunk
// of bytes delivered delay after it was read, in order. Short waits spin
// (yielding): a timer's resolution on a virtual machine is coarser than
// the delays worth simulating.
func delayProxy(b *testing.B, target string, delay time.Duration) string {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	b.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	type chunk struct {
		due  time.Time
		data []byte
	}
	pipe := func(dst, src net.Conn) {
		q := make(chan chunk, 1024)
		wg.Go(func() {
			for c := range q {
				for time.Until(c.due) > 0 {
					runtime.Gosched()
				}
				if _, err := dst.Write(c.data); err != nil {
					break
				}
			}
			dst.Close()
		})
		buf := make([]byte, 64<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				q <- chunk{time.Now().Add(delay), slices.Clone(buf[:n])}
			}
			if err != nil {
				close(q)
				return
			}
		}
	}
	wg.Go(func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				client.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, client, server)
			mu.Unlock()
			wg.Go(func() { pipe(server, client) })
			wg.Go(func() { pipe(client, server) })
		}
	})
	return ln.Addr().String()
}

// BenchmarkHandoffVsBare times, alternating in one loop, natssem's handoff
// to a running waiter (as BenchmarkHandoff, released as soon as the server
// counts the waiter) and the same protocol played bare with plain nats.go
// (as bench/natsproto.go plays it: the releaser's compare-and-set of the
// slot record and its Nak, the push to the waiting pull, the waiter's read
// of the record and its compare-and-set), so that both see the same
// machine. It reports each median and their ratio: what the library costs
// on top of its protocol.
func BenchmarkHandoffVsBare(b *testing.B) {
	ctx := context.Background()
	const name = "bench-vsbare"
	a, w, js, consumer := handoffPair(b, name)
	bare := newBareKV(b, js)
	waiting := func(c jetstream.Consumer) func() bool {
		return func() bool {
			info, err := c.Info(ctx)
			return err == nil && info.NumWaiting >= 1
		}
	}
	var lib, raw []time.Duration
	for b.Loop() {
		b.StopTimer()
		// natssem
		held, err := a.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		type got struct {
			release func() error
			at      time.Time
			err     error
		}
		ch := make(chan got, 1)
		go func() {
			p, err := w.Acquire(ctx)
			g := got{at: time.Now(), err: err}
			if p != nil {
				g.release = func() error { return p.Release(ctx) }
			}
			ch <- g
		}()
		poll(b, waiting(consumer))
		b.StartTimer()
		t0 := time.Now()
		if err := held.Release(ctx); err != nil {
			b.Fatal(err)
		}
		g := <-ch
		b.StopTimer()
		if g.err != nil {
			b.Fatal(g.err)
		}
		lib = append(lib, g.at.Sub(t0))
		if err := g.release(); err != nil {
			b.Fatal(err)
		}
		// the protocol bare
		h, err := bare.acquire(bare.holder)
		if err != nil {
			b.Fatal(err)
		}
		go func() {
			wh, err := bare.acquire(bare.waiter)
			g := got{at: time.Now(), err: err}
			g.release = func() error { return bare.release(bare.waiter, wh) }
			ch <- g
		}()
		poll(b, waiting(bare.cons))
		b.StartTimer()
		t0 = time.Now()
		if err := bare.release(bare.holder, h); err != nil {
			b.Fatal(err)
		}
		g = <-ch
		b.StopTimer()
		if g.err != nil {
			b.Fatal(g.err)
		}
		raw = append(raw, g.at.Sub(t0))
		if err := g.release(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	l50, r50 := benchtest.Percentile(lib, 0.5), benchtest.Percentile(raw, 0.5)
	b.ReportMetric(float64(l50.Microseconds()), "natssem-p50-µs")
	b.ReportMetric(float64(r50.Microseconds()), "bare-p50-µs")
	b.ReportMetric(float64(l50)/float64(r50), "natssem/bare")
}

// poll calls cond every 100 µs until it holds, for at most 10 s.
func poll(b *testing.B, cond func() bool) {
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			b.Fatal("waiter never queued")
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// bareKV is natssem's protocol with plain nats.go, one slot: a token in a
// work-queue stream, the slot's holder a record in a KV bucket, a waiter
// one pull at a time on an inbox of its own.
type bareKV struct {
	b              *testing.B
	cons           jetstream.Consumer
	holder, waiter *barePuller
}

type barePuller struct {
	nc    *nats.Conn
	sub   *nats.Subscription
	inbox string
}

const (
	bareBucket = "bench_bare"
	bareKey    = "$KV." + bareBucket + ".slot.0"
)

func newBareKV(b *testing.B, js jetstream.JetStream) *bareKV {
	ctx := context.Background()
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bareBucket, History: 1, Storage: jetstream.FileStorage}); err != nil {
		b.Fatal(err)
	}
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "BENCH_BARE", Subjects: []string{"bench.bare"},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage})
	if err != nil {
		b.Fatal(err)
	}
	cons, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "holders", AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: time.Minute, MaxWaiting: 512})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := js.Publish(ctx, "bench.bare", []byte("0")); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = js.DeleteStream(ctx, "BENCH_BARE")
		_ = js.DeleteKeyValue(ctx, bareBucket)
	})
	puller := func() *barePuller {
		nc := connect(b, srv.Addr().String())
		inbox := nc.NewInbox()
		sub, err := nc.SubscribeSync(inbox)
		if err != nil {
			b.Fatal(err)
		}
		return &barePuller{nc: nc, sub: sub, inbox: inbox}
	}
	return &bareKV{b: b, cons: cons, holder: puller(), waiter: puller()}
}

type bareHeld struct {
	m     *nats.Msg
	claim uint64
}

// acquire pulls the token, reads the slot record and takes it by
// compare-and-set.
func (k *bareKV) acquire(p *barePuller) (bareHeld, error) {
	req := []byte(`{"batch":1,"expires":5000000000}`)
	if err := p.nc.PublishRequest("$JS.API.CONSUMER.MSG.NEXT.BENCH_BARE.holders", p.inbox, req); err != nil {
		return bareHeld{}, err
	}
	m, err := p.sub.NextMsg(10 * time.Second)
	if err != nil {
		return bareHeld{}, err
	}
	if st := m.Header.Get("Status"); st != "" {
		return bareHeld{}, fmt.Errorf("pull answered %s", st)
	}
	r, err := p.nc.Request("$JS.API.DIRECT.GET.KV_"+bareBucket, []byte(`{"last_by_subj":"`+bareKey+`"}`), 5*time.Second)
	if err != nil {
		return bareHeld{}, err
	}
	var rev uint64
	if r.Header.Get("Status") == "" {
		if rev, err = strconv.ParseUint(r.Header.Get("Nats-Sequence"), 10, 64); err != nil {
			return bareHeld{}, err
		}
	}
	claim, err := bareCAS(p.nc, rev, []byte(`{"h":"bench"}`))
	if err != nil {
		return bareHeld{}, err
	}
	return bareHeld{m: m, claim: claim}, nil
}

// release writes the record free by compare-and-set, then Naks the token.
func (k *bareKV) release(p *barePuller, h bareHeld) error {
	if _, err := bareCAS(p.nc, h.claim, []byte(`{}`)); err != nil {
		return err
	}
	return h.m.Nak()
}

func bareCAS(nc *nats.Conn, last uint64, body []byte) (uint64, error) {
	m := nats.NewMsg(bareKey)
	m.Data = body
	m.Header.Set("Nats-Expected-Last-Subject-Sequence", strconv.FormatUint(last, 10))
	r, err := nc.RequestMsg(m, 5*time.Second)
	if err != nil {
		return 0, err
	}
	var ack struct {
		Seq   uint64              `json:"seq"`
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(r.Data, &ack); err != nil {
		return 0, err
	}
	if ack.Error != nil {
		return 0, ack.Error
	}
	return ack.Seq, nil
}

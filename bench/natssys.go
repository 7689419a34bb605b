package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem/internal/natstest"
	"github.com/tokensem/tokensem/natssem"
	"github.com/tokensem/tokensem/natssem/embedded"
)

// natsSystem is natssem on an embedded nats-server (loopback, file store in
// a temporary directory, R1) started by the harness, or on a 3-node cluster
// of them (-nats-cluster: R3 semaphores, clients spread over the nodes).
// With an external URL (-nats-url) it uses that server instead.
type natsSystem struct {
	srv     *embedded.Server  // nil for an external server or a cluster
	cluster *natstest.Cluster // -nats-cluster
	dir     string            // the cluster's stores
	url     string
	probe   *nats.Conn
	js      jetstream.JetStream
	group   string // -nats-group: every semaphore a key of this group
	// replicas of every semaphore and of the protocols' streams
	// (natsproto.go); 0 is the default, 1.
	replicas int
}

// startNATS starts the embedded server (or a 3-node cluster of them), or
// connects to url when set.
func startNATS(ctx context.Context, url, group string, cluster bool) (*natsSystem, error) {
	n := &natsSystem{url: url, group: group}
	switch {
	case cluster:
		dir, err := os.MkdirTemp("", "bench-nats-cluster-")
		if err != nil {
			return nil, err
		}
		n.dir = dir
		if n.cluster, err = natstest.StartCluster(ctx, 3, dir); err != nil {
			n.Close()
			return nil, err
		}
		n.url, n.replicas = n.cluster.URL(), 3
	case url == "":
		var err error
		if n.srv, err = embedded.Start(embedded.Config{}); err != nil {
			return nil, err
		}
		n.url = n.srv.URL()
	}
	probe, err := nats.Connect(n.url, nats.Name("bench-probe"))
	if err != nil {
		n.Close()
		return nil, err
	}
	n.probe = probe
	if n.js, err = jetstream.New(probe); err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

// InProcess reports whether the servers run in the harness's process (an
// embedded server or cluster, not -nats-url).
func (n *natsSystem) InProcess() bool { return n.srv != nil || n.cluster != nil }

func (n *natsSystem) Key() string   { return "natssem" }
func (n *natsSystem) Label() string { return "natssem" }

// Version is the server version the probe connection reports.
func (n *natsSystem) Version() string { return n.probe.ConnectedServerVersion() }

func (n *natsSystem) Connect(ctx context.Context) (Client, error) {
	nc, err := nats.Connect(n.url, nats.Name("bench"))
	if err != nil {
		return nil, err
	}
	return natsClient{nc: nc, group: n.group, replicas: n.replicas}, nil
}

// groupOpts returns the options every natssem call takes: the group, if
// any.
func groupOpts(group string) []natssem.Option {
	if group == "" {
		return nil
	}
	return []natssem.Option{natssem.WithGroup(group)}
}

func (n *natsSystem) Waiting(ctx context.Context, name string) (int, error) {
	stream, consumer := natssem.ResourcesOf(name, "").Stream, "holders"
	if n.group != "" {
		stream, consumer = natssem.ResourcesOf("", n.group).Stream, "holders_"+name
	}
	return pullsWaiting(ctx, n.js, stream, consumer)
}

// pullsWaiting is how many pulls consumer counts waiting.
func pullsWaiting(ctx context.Context, js jetstream.JetStream, stream, consumer string) (int, error) {
	c, err := js.Consumer(ctx, stream, consumer)
	if err != nil {
		return 0, err
	}
	info, err := c.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.NumWaiting, nil
}

// WaitersPerClient is natssem's cap on one handle's waiting callers
// (natssem.WithMaxLocalWaiters).
func (n *natsSystem) WaitersPerClient() int { return natssem.DefaultMaxLocalWaiters }

func (n *natsSystem) Cleanup(ctx context.Context, name string) {
	if n.group != "" {
		_ = natssem.ForceDelete(ctx, n.probe, name, groupOpts(n.group)...)
		return
	}
	_ = n.js.DeleteStream(ctx, natssem.ResourcesOf(name, "").Stream)
	_ = n.js.DeleteKeyValue(ctx, natssem.ResourcesOf(name, "").Bucket)
}

func (n *natsSystem) Close() {
	if n.probe != nil {
		n.probe.Close()
	}
	if n.srv != nil {
		n.srv.Shutdown()
	}
	if n.cluster != nil {
		n.cluster.Shutdown()
	}
	if n.dir != "" {
		_ = os.RemoveAll(n.dir)
	}
}

type natsClient struct {
	nc       *nats.Conn
	group    string
	replicas int
}

func (c natsClient) Init(ctx context.Context, name string, permits, maxWaiters int) (Sem, error) {
	opts := groupOpts(c.group)
	if c.replicas > 1 {
		opts = append(opts, natssem.WithReplicas(c.replicas))
	}
	if maxWaiters > natssem.DefaultMaxWaiters {
		opts = append(opts, natssem.WithMaxWaiters(maxWaiters))
	}
	s, err := natssem.Init(ctx, c.nc, name, permits, opts...)
	if err != nil {
		return nil, err
	}
	return tokenSem{s: s}, nil
}

func (c natsClient) Open(ctx context.Context, name string) (Sem, error) {
	s, err := natssem.Open(ctx, c.nc, name, groupOpts(c.group)...)
	if err != nil {
		return nil, err
	}
	return tokenSem{s: s}, nil
}

func (c natsClient) Close() error { c.nc.Close(); return nil }

// rawRTT measures core-NATS request-reply round trips between a requester
// and a responder on two connections of their own: the reference the NATS
// targets are stated against. gap is an idle pause before each request
// (0: back to back).
func (n *natsSystem) rawRTT(ctx context.Context, samples int, gap time.Duration) ([]time.Duration, error) {
	req, err := nats.Connect(n.url, nats.Name("bench-requester"))
	if err != nil {
		return nil, err
	}
	defer req.Close()
	resp, err := nats.Connect(n.url, nats.Name("bench-responder"))
	if err != nil {
		return nil, err
	}
	defer resp.Close()
	sub, err := resp.Subscribe("bench.rtt", func(m *nats.Msg) { _ = m.Respond(m.Data) })
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := resp.Flush(); err != nil {
		return nil, err
	}
	d := make([]time.Duration, 0, samples)
	for i := range samples + samples/10 {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if gap > 0 {
			time.Sleep(gap)
		}
		t0 := time.Now()
		if _, err := req.Request("bench.rtt", []byte("x"), 5*time.Second); err != nil {
			return nil, err
		}
		if i >= samples/10 { // the first tenth warms up
			d = append(d, time.Since(t0))
		}
	}
	return d, nil
}

// Primitives are the JetStream operations a fenced natssem cycle is made
// of, measured with plain nats.go in the same run.
type Primitives struct {
	CAS     Summary // KV compare-and-set (publish with expected revision)
	NakPull Summary // Nak of the held message + one-message pull
}

// primitives measures a KV compare-and-set and a Nak followed by a
// one-message pull on a work-queue stream, as natssem's BenchmarkPrimitives
// does: one pull and two compare-and-sets in sequence are the floor of any
// fenced acquire+release.
func (n *natsSystem) primitives(ctx context.Context, samples int) (Primitives, error) {
	nc, err := nats.Connect(n.url, nats.Name("bench-primitives"))
	if err != nil {
		return Primitives{}, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return Primitives{}, err
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "bench_prim", History: 1, Storage: jetstream.FileStorage})
	if err != nil {
		return Primitives{}, err
	}
	defer func() { _ = js.DeleteKeyValue(context.Background(), "bench_prim") }()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "BENCH_PRIM", Subjects: []string{"bench.prim"},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage})
	if err != nil {
		return Primitives{}, err
	}
	defer func() { _ = js.DeleteStream(context.Background(), "BENCH_PRIM") }()
	cons, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		return Primitives{}, err
	}
	if _, err := js.Publish(ctx, "bench.prim", []byte("t")); err != nil {
		return Primitives{}, err
	}
	rev, err := kv.Put(ctx, "k", []byte("v"))
	if err != nil {
		return Primitives{}, err
	}
	var cas, pull []time.Duration
	var last jetstream.Msg
	for i := range samples + samples/10 {
		t0 := time.Now()
		if rev, err = kv.Update(ctx, "k", []byte("v"), rev); err != nil {
			return Primitives{}, err
		}
		t1 := time.Now()
		if last != nil {
			_ = last.Nak()
		}
		if last, err = fetchOne(cons); err != nil {
			return Primitives{}, fmt.Errorf("primitives: %w", err)
		}
		t2 := time.Now()
		if i >= samples/10 {
			cas, pull = append(cas, t1.Sub(t0)), append(pull, t2.Sub(t1))
		}
	}
	return Primitives{CAS: Summarize(cas), NakPull: Summarize(pull)}, nil
}

// fetchOne pulls one message from c, waiting up to 5 s for it.
func fetchOne(c jetstream.Consumer) (jetstream.Msg, error) {
	batch, err := c.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		return nil, err
	}
	var last jetstream.Msg
	for m := range batch.Messages() {
		last = m
	}
	if last == nil {
		return nil, fmt.Errorf("pull returned nothing: %v", batch.Error())
	}
	return last, nil
}

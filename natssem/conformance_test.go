package natssem_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/driver"
	"github.com/tokensem/tokensem/internal/semtest"
	"github.com/tokensem/tokensem/natssem"
)

// conns maps each semaphore a test opened to its connection, for Crash.
var conns sync.Map

// connect connects to the server at addr (a node or a fault proxy in front
// of one). It does not follow the servers a cluster announces: a client
// behind a proxy must reconnect through the proxy.
func connect(t testing.TB, addr string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect("nats://"+addr, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond),
		nats.IgnoreDiscoveredServers())
	if err != nil {
		t.Fatalf("connect %s: %v", addr, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func natsOptions(o semtest.Options, extra []natssem.Option) []natssem.Option {
	opts := append([]natssem.Option(nil), extra...)
	if o.Lease != 0 {
		opts = append(opts, natssem.WithLease(o.Lease))
	}
	if o.Key != nil {
		opts = append(opts, natssem.WithKey(o.Key))
	}
	if o.Logger != nil {
		opts = append(opts, natssem.WithLogger(o.Logger))
	}
	if o.Observer != nil {
		opts = append(opts, natssem.WithObserver(o.Observer))
	}
	return opts
}

// natsBackend adapts the servers at addrs (one node, or the nodes of a
// cluster) to the conformance suite. Clients asked for addrs[0] are spread
// over the nodes in turn; other addresses (fault proxies) are used as
// given. extra options go to every Init.
func natsBackend(name string, addrs []string, extra ...natssem.Option) semtest.Backend {
	var next atomic.Int64
	spread := func(addr string) string {
		if addr != addrs[0] {
			return addr
		}
		return addrs[int(next.Add(1))%len(addrs)]
	}
	return semtest.Backend{
		Name: name,
		Addr: addrs[0],
		Init: func(t testing.TB, addr, name string, permits int, o semtest.Options) (tokensem.Semaphore, error) {
			nc := connect(t, spread(addr))
			s, err := natssem.Init(t.Context(), nc, name, permits, natsOptions(o, extra)...)
			if err != nil {
				return nil, err
			}
			conns.Store(s, nc)
			return s, nil
		},
		Open: func(t testing.TB, addr, name string, o semtest.Options) (tokensem.Semaphore, error) {
			nc := connect(t, spread(addr))
			s, err := natssem.Open(t.Context(), nc, name, natsOptions(o, nil)...)
			if err != nil {
				return nil, err
			}
			conns.Store(s, nc)
			return s, nil
		},
		InjectRaw: func(t testing.TB, name string, data []byte) {
			t.Helper()
			nc := connect(t, spread(addrs[0]))
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			if _, err := js.Publish(ctx, natssem.ResourcesOf(name, "").Subject, data); err != nil {
				t.Fatalf("inject into %s: %v", name, err)
			}
		},
		Crash: func(t testing.TB, s tokensem.Semaphore) {
			nc, ok := conns.Load(s)
			if !ok {
				t.Fatal("crash: unknown semaphore")
			}
			nc.(*nats.Conn).Close()
		},
		Inventory: func(s tokensem.Semaphore) driver.Inventory { return s.(*natssem.Semaphore).Inventory() },
		Delete: func(t testing.TB, name string, force bool) error {
			nc := connect(t, spread(addrs[0]))
			if force {
				return natssem.ForceDelete(semtest.CleanupContext(t, time.Minute), nc, name)
			}
			return natssem.Delete(semtest.CleanupContext(t, time.Minute), nc, name)
		},
		List: func(t testing.TB) ([]tokensem.Info, error) {
			return natssem.List(semtest.Context(t, time.Minute), connect(t, spread(addrs[0])))
		},
		ReplaceConfig: func(t testing.TB, name string, edit func([]byte) []byte) {
			replaceRecord(t, addrs[0], natssem.ResourcesOf(name, "").Bucket, "config", edit)
		},
	}
}

// replaceRecord replaces the KV record key of bucket with edit of it, by
// compare-and-set, as a client with write access to the bucket could.
func replaceRecord(t testing.TB, addr, bucket, key string, edit func([]byte) []byte) {
	t.Helper()
	js, err := jetstream.New(connect(t, addr))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		t.Fatal(err)
	}
	var old []byte
	var rev uint64
	switch e, err := kv.Get(ctx, key); {
	case errors.Is(err, jetstream.ErrKeyNotFound):
	case err != nil:
		t.Fatal(err)
	default:
		old, rev = e.Value(), e.Revision()
	}
	if _, err := kv.Update(ctx, key, edit(old), rev); err != nil {
		t.Fatalf("replace %s of %s: %v", key, bucket, err)
	}
}

func TestConformance(t *testing.T) {
	semtest.Run(t, natsBackend("nats", []string{srv.Addr().String()}))
}

// TestConformanceCluster runs the suite on a 3-node cluster with the
// stream and bucket replicated 3 ways, clients spread over the nodes: a
// replicated bucket answers a lost compare-and-set with another error code
// than a single node, and the suite must not see a broker error.
func TestConformanceCluster(t *testing.T) {
	c := cluster(t)
	addrs := make([]string, c.Size())
	for i := range addrs {
		addrs[i] = c.Addr(i)
	}
	semtest.Run(t, natsBackend("nats", addrs, natssem.WithReplicas(3)))
}

// natsGroupBackend is natsBackend for the keys of one group (WithGroup):
// every call names the group, and raw messages go to the key's subject.
func natsGroupBackend(name, group string, addrs []string, extra ...natssem.Option) semtest.Backend {
	in := natssem.WithGroup(group)
	b := natsBackend(name, addrs, append(extra, in)...)
	b.Open = func(t testing.TB, addr, name string, o semtest.Options) (tokensem.Semaphore, error) {
		nc := connect(t, addr)
		s, err := natssem.Open(t.Context(), nc, name, natsOptions(o, []natssem.Option{in})...)
		if err != nil {
			return nil, err
		}
		conns.Store(s, nc)
		return s, nil
	}
	b.InjectRaw = func(t testing.TB, name string, data []byte) {
		t.Helper()
		js, err := jetstream.New(connect(t, addrs[0]))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		if _, err := js.Publish(ctx, natssem.ResourcesOf(name, group).Subject, data); err != nil {
			t.Fatalf("inject into %s of %s: %v", name, group, err)
		}
	}
	b.Delete = func(t testing.TB, name string, force bool) error {
		nc := connect(t, addrs[0])
		if force {
			return natssem.ForceDelete(semtest.CleanupContext(t, time.Minute), nc, name, in)
		}
		return natssem.Delete(semtest.CleanupContext(t, time.Minute), nc, name, in)
	}
	b.List = func(t testing.TB) ([]tokensem.Info, error) {
		return natssem.List(semtest.Context(t, time.Minute), connect(t, addrs[0]), in)
	}
	b.ReplaceConfig = func(t testing.TB, name string, edit func([]byte) []byte) {
		replaceRecord(t, addrs[0], natssem.ResourcesOf("", group).Bucket, name+".config", edit)
	}
	return b
}

// TestConformanceGroup runs the suite on keys of one group: one stream and
// one bucket shared by every semaphore of the suite.
func TestConformanceGroup(t *testing.T) {
	semtest.Run(t, natsGroupBackend("nats", "suite", []string{srv.Addr().String()}))
}

// TestConformanceClusterKeys runs the suite on keys of one group on a
// 3-node cluster, replicated 3 ways, clients spread over the nodes.
func TestConformanceClusterKeys(t *testing.T) {
	c := cluster(t)
	addrs := make([]string, c.Size())
	for i := range addrs {
		addrs[i] = c.Addr(i)
	}
	semtest.Run(t, natsGroupBackend("nats", "suite", addrs, natssem.WithReplicas(3)))
}

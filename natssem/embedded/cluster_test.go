package embedded_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tokensem/tokensem/internal/freeport"
	"github.com/tokensem/tokensem/natssem/embedded"
)

// startCluster starts an n-node cluster in this process on loopback,
// each node with its own store and all routes, and waits until every
// node's JetStream answers.
func startCluster(tb testing.TB, n int, sync embedded.SyncPolicy) []*embedded.Server {
	tb.Helper()
	var routes, listen, stores []string
	for range n {
		addr := freeport.Need(tb, 1)[0]
		listen = append(listen, addr)
		routes = append(routes, "nats-route://"+addr)
		stores = append(stores, tb.TempDir()) // removed after the Shutdown below
	}
	var nodes []*embedded.Server
	tb.Cleanup(func() {
		for _, s := range nodes {
			s.Shutdown()
		}
	})
	for i := range n {
		s, err := embedded.Start(embedded.Config{
			StoreDir:      stores[i],
			ServerName:    fmt.Sprintf("n%d", i),
			ClusterListen: listen[i],
			Routes:        routes,
			Sync:          sync,
		})
		if err != nil {
			tb.Fatalf("node %d: %v", i, err)
		}
		if got, want := s.ClusterURL(), routes[i]; got != want {
			tb.Fatalf("node %d: ClusterURL() = %q, want %q", i, got, want)
		}
		nodes = append(nodes, s)
	}
	ctx, cancel := context.WithTimeout(tb.Context(), 30*time.Second)
	defer cancel()
	for _, s := range nodes {
		if _, err := s.WaitJetStream(ctx); err != nil {
			tb.Fatalf("%s: JetStream not ready: %v", s.Name(), err)
		}
	}
	return nodes
}

func TestCluster(t *testing.T) {
	nodes := startCluster(t, 3, embedded.SyncDefault)
	leaders := map[string]bool{}
	for _, s := range nodes {
		if p, _ := s.Sync(); p != embedded.SyncAlways {
			t.Errorf("%s: sync %v on a kept store, want always", s.Name(), p)
		}
		leaders[s.MetaLeader()] = true
	}
	if len(leaders) != 1 || leaders[""] {
		t.Fatalf("meta leaders seen by the nodes: %v, want one", leaders)
	}
}

func TestWaitJetStreamStandalone(t *testing.T) {
	s, err := embedded.Start(embedded.Config{ServerName: "solo"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	if s.ClusterURL() != "" {
		t.Errorf("ClusterURL() = %q on a standalone server", s.ClusterURL())
	}
	leader, err := s.WaitJetStream(t.Context())
	if err != nil || leader != "solo" {
		t.Fatalf("WaitJetStream = %q, %v; want solo", leader, err)
	}
}

// A lone cluster node has no majority: WaitJetStream waits until ctx ends.
func TestWaitJetStreamNeedsQuorum(t *testing.T) {
	s, err := embedded.Start(embedded.Config{StoreDir: t.TempDir(), ServerName: "n0", ClusterListen: "127.0.0.1:0",
		Routes: []string{"nats-route://127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	if leader, err := s.WaitJetStream(ctx); err == nil {
		t.Fatalf("WaitJetStream = %q on a lone node of a cluster", leader)
	}
}

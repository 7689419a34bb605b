// Package natstest runs NATS JetStream clusters for tests: three servers on
// loopback, each with its own store, routed to each other, so that library
// tests run against replicated (R3) streams and can stop and restart a
// node. The servers run inside the test process (StartCluster) or as
// `seminit server` processes (StartProcessCluster).
package natstest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem/internal/freeport"
	"github.com/tokensem/tokensem/natssem/embedded"
)

// Cluster is a JetStream cluster of embedded servers.
type Cluster struct {
	name    string
	client  []string // client host:port of each node
	routes  []string // cluster host:port of each node
	stores  []string
	mu      sync.Mutex
	servers []*embedded.Server // nil while a node is stopped
	procs   []*node            // of a process cluster; nil while a node is stopped
}

// StartCluster starts an n-node cluster (n >= 3 for R3) with stores under
// dir and waits until JetStream answers.
func StartCluster(ctx context.Context, n int, dir string) (*Cluster, error) {
	return startCluster(ctx, &Cluster{name: "tokensem-test", servers: make([]*embedded.Server, n)}, n, dir)
}

func startCluster(ctx context.Context, c *Cluster, n int, dir string) (*Cluster, error) {
	var err error
	if c.client, err = freeport.Addrs(n); err != nil {
		return nil, err
	}
	if c.routes, err = freeport.Addrs(n); err != nil {
		return nil, err
	}
	for i := range n {
		c.stores = append(c.stores, fmt.Sprintf("%s/n%d", dir, i))
	}
	// Start the nodes in parallel: each waits for its routes.
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = c.Restart(i) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.Shutdown()
		return nil, err
	}
	if err := c.WaitJetStream(ctx); err != nil {
		c.Shutdown()
		return nil, err
	}
	return c, nil
}

// URL returns the comma-separated client URLs of every node.
func (c *Cluster) URL() string {
	urls := make([]string, len(c.client))
	for i, a := range c.client {
		urls[i] = "nats://" + a
	}
	return strings.Join(urls, ",")
}

// Addr returns node i's client host:port.
func (c *Cluster) Addr(i int) string { return c.client[i] }

// Size returns the number of nodes.
func (c *Cluster) Size() int { return len(c.client) }

// ServerName is node i's server name.
func ServerName(i int) string { return "n" + strconv.Itoa(i) }

// Stop shuts node i down (its store stays).
func (c *Cluster) Stop(i int) {
	if c.procs != nil {
		c.mu.Lock()
		p := c.procs[i]
		c.procs[i] = nil
		c.mu.Unlock()
		if p != nil {
			p.stop()
		}
		return
	}
	c.mu.Lock()
	s := c.servers[i]
	c.servers[i] = nil
	c.mu.Unlock()
	if s != nil {
		s.Shutdown()
	}
}

// Restart starts node i on its store (it must be stopped).
func (c *Cluster) Restart(i int) error {
	var routes []string
	for _, a := range c.routes {
		routes = append(routes, "nats-route://"+a)
	}
	if c.procs != nil {
		p, err := startNode(c.client[i], c.stores[i], ServerName(i), c.name, c.routes[i], strings.Join(routes, ","))
		if err != nil {
			return fmt.Errorf("natstest: node %d: %w", i, err)
		}
		c.mu.Lock()
		c.procs[i] = p
		c.mu.Unlock()
		return nil
	}
	host, port, err := splitHostPort(c.routes[i])
	if err != nil {
		return err
	}
	s, err := embedded.Start(embedded.Config{
		Listen: c.client[i], StoreDir: c.stores[i], ServerName: ServerName(i), ReadyTimeout: 30 * time.Second,
		Sync: embedded.SyncInterval, // as in nats-server's default; Stop shuts a node down cleanly
		Options: func(o *server.Options) error {
			o.Cluster = server.ClusterOpts{Name: c.name, Host: host, Port: port}
			o.Routes = server.RoutesFromStr(strings.Join(routes, ","))
			return nil
		},
	})
	if err != nil {
		return fmt.Errorf("natstest: node %d: %w", i, err)
	}
	c.mu.Lock()
	c.servers[i] = s
	c.mu.Unlock()
	return nil
}

// Shutdown stops every node.
func (c *Cluster) Shutdown() {
	for i := range c.client {
		c.Stop(i)
	}
}

// WaitJetStream waits until every running node answers JetStream requests.
func (c *Cluster) WaitJetStream(ctx context.Context) error {
	for i := range c.client {
		c.mu.Lock()
		up := c.servers != nil && c.servers[i] != nil || c.procs != nil && c.procs[i] != nil
		c.mu.Unlock()
		if !up {
			continue
		}
		if err := waitJetStream(ctx, "nats://"+c.client[i]); err != nil {
			return fmt.Errorf("natstest: node %d: %w", i, err)
		}
	}
	return nil
}

func waitJetStream(ctx context.Context, url string) error {
	nc, err := nats.Connect(url)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	for {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := js.AccountInfo(actx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("JetStream not ready: %w", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// StreamLeader returns the index of the node leading stream, asking
// through nc.
func (c *Cluster) StreamLeader(ctx context.Context, nc *nats.Conn, stream string) (int, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return 0, err
	}
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return 0, err
	}
	info := s.CachedInfo()
	if info.Cluster == nil || info.Cluster.Leader == "" {
		return 0, fmt.Errorf("natstest: stream %s has no leader", stream)
	}
	for i := range c.client {
		if ServerName(i) == info.Cluster.Leader {
			return i, nil
		}
	}
	return 0, fmt.Errorf("natstest: stream %s led by unknown server %q", stream, info.Cluster.Leader)
}

func splitHostPort(addr string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	return host, port, err
}

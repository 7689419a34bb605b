package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem/internal/freeport"
	"github.com/tokensem/tokensem/natssem"
)

// seminitCluster is a NATS JetStream cluster of `seminit server`
// processes on loopback: node i is named n<i> and has its own client
// port, cluster port and store, kept across kill and restart. Every node
// gets the routes of all nodes. The test's cleanup stops the nodes.
type seminitCluster struct {
	t      testing.TB
	nodes  []*clusterNode
	routes string   // --routes: every node's cluster URL
	extra  []string // more flags for every node
}

// clusterNode is one `seminit server` of a seminitCluster.
type clusterNode struct {
	name  string // server name, n<i>
	url   string // client URL, nats://127.0.0.1:port
	route string // cluster URL, nats-route://127.0.0.1:port
	store string // JetStream store directory
	proc  *proc  // the running server; nil while the node is down
}

// startCluster starts an n-node cluster and waits until every node says
// JetStream is ready (a meta leader is elected and the node caught up) and
// the cluster can place a stream on all n nodes. extra are more `seminit
// server` flags for every node, such as --sync.
func startCluster(t testing.TB, n int, extra ...string) *seminitCluster {
	t.Helper()
	addrs := freeport.Need(t, 2*n)
	c := &seminitCluster{t: t, extra: extra}
	var routes []string
	for i := range n {
		c.nodes = append(c.nodes, &clusterNode{
			name:  fmt.Sprintf("n%d", i),
			url:   "nats://" + addrs[i],
			route: "nats-route://" + addrs[n+i],
			store: t.TempDir(),
		})
		routes = append(routes, c.nodes[i].route)
	}
	c.routes = strings.Join(routes, ",")
	for i := range c.nodes {
		c.start(i)
	}
	for i := range c.nodes {
		c.waitReady(i)
	}
	c.waitPlacement(20 * time.Second)
	return c
}

// waitPlacement waits (at most d) until a stream replicated on every node
// can be created, by creating and deleting one. A meta leader places
// replicas only on nodes that have sent it their statistics; until then
// (a moment after the cluster forms, longer under load) it answers "no
// suitable peers for placement, peer offline".
func (c *seminitCluster) waitPlacement(d time.Duration) {
	c.t.Helper()
	nc, err := nats.Connect(c.nodes[0].url)
	if err != nil {
		c.t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		c.t.Fatal(err)
	}
	const probe = "SEMINIT_TEST_PLACEMENT"
	eventually(c.t, d, fmt.Sprintf("an R%d stream placed", len(c.nodes)), func() bool {
		ctx, cancel := context.WithTimeout(c.t.Context(), 2*time.Second)
		defer cancel()
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: probe, Replicas: len(c.nodes), Storage: jetstream.MemoryStorage})
		if err != nil {
			c.t.Logf("placement probe: %v", err)
		}
		return err == nil
	})
	ctx, cancel := context.WithTimeout(c.t.Context(), 10*time.Second)
	defer cancel()
	if err := js.DeleteStream(ctx, probe); err != nil {
		c.t.Fatalf("delete placement probe: %v", err)
	}
}

// start starts node i's `seminit server`.
func (c *seminitCluster) start(i int) {
	c.t.Helper()
	node := c.nodes[i]
	node.proc = startSeminit(c.t, c.broker(i).env(), append([]string{"server",
		"--listen", strings.TrimPrefix(node.url, "nats://"), "--store", node.store,
		"--server-name", node.name, "--cluster-listen", strings.TrimPrefix(node.route, "nats-route://"),
		"--routes", c.routes}, c.extra...)...)
}

// waitReady waits until node i prints its "JetStream ready" line.
func (c *seminitCluster) waitReady(i int) {
	c.t.Helper()
	p := c.nodes[i].proc
	eventually(c.t, 30*time.Second, c.nodes[i].name+" JetStream ready", func() bool {
		if p.exited() {
			c.t.Fatalf("%s exited: %v", c.nodes[i].name, p.res)
		}
		return strings.Contains(p.stdout.String(), "seminit: JetStream ready")
	})
}

// broker returns the broker reached through node i, for b.seminit.
func (c *seminitCluster) broker(i int) broker {
	b := natsBroker()
	b.url = c.nodes[i].url
	return b
}

// kill SIGKILLs node i and waits for it to exit.
func (c *seminitCluster) kill(i int) {
	c.t.Helper()
	node := c.nodes[i]
	if node.proc == nil {
		c.t.Fatalf("kill %s: already down", node.name)
	}
	_ = node.proc.cmd.Process.Kill()
	node.proc.wait(10 * time.Second)
	node.proc = nil
}

// restart starts node i again on its store and ports, and waits until its
// JetStream is ready: a majority of the nodes must be up.
func (c *seminitCluster) restart(i int) {
	c.t.Helper()
	node := c.nodes[i]
	if node.proc != nil {
		c.t.Fatalf("restart %s: still running", node.name)
	}
	c.start(i)
	c.waitReady(i)
}

// up returns the indexes of the running nodes.
func (c *seminitCluster) up() []int {
	var up []int
	for i, n := range c.nodes {
		if n.proc != nil {
			up = append(up, i)
		}
	}
	return up
}

// raftGroup names a replicated JetStream asset, which has its own leader:
// a stream, or a consumer of it.
type raftGroup struct {
	stream   string
	consumer string // "" for the stream itself
}

func (g raftGroup) String() string {
	if g.consumer == "" {
		return "stream " + g.stream
	}
	return "consumer " + g.stream + "/" + g.consumer
}

// semaphoreGroups returns the groups a natssem semaphore lives in: its
// token stream, its KV bucket's stream and its holders' consumer.
func semaphoreGroups(name string) []raftGroup {
	return []raftGroup{
		{stream: natssem.ResourcesOf(name, "").Stream},
		{stream: "KV_" + natssem.ResourcesOf(name, "").Bucket},
		{stream: natssem.ResourcesOf(name, "").Stream, consumer: "holders"},
	}
}

// streamLeader returns the index of the node that leads stream.
func (c *seminitCluster) streamLeader(stream string, d time.Duration) int {
	c.t.Helper()
	return c.leader(raftGroup{stream: stream}, d)
}

// leader returns the index of the node that leads g. It asks the running
// nodes and polls, at most d, until one of them names a running node:
// after a node is lost, the others can name it until they elect another
// (for a SIGKILLed leader nats-server's Raft waits 4 to 9 s).
func (c *seminitCluster) leader(g raftGroup, d time.Duration) int {
	c.t.Helper()
	leader := -1
	eventually(c.t, d, "a running leader of "+g.String(), func() bool {
		for _, i := range c.up() {
			name := c.askLeader(i, g)
			if j := slices.IndexFunc(c.nodes, func(n *clusterNode) bool { return n.name == name }); j >= 0 && c.nodes[j].proc != nil {
				leader = j
				return true
			}
		}
		return false
	})
	return leader
}

// askLeader asks node i which server leads g; "" when it cannot tell.
func (c *seminitCluster) askLeader(i int, g raftGroup) string {
	nc, err := c.connect(i)
	if err != nil {
		return ""
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(c.t.Context(), time.Second)
	defer cancel()
	var ci *jetstream.ClusterInfo
	if g.consumer == "" {
		s, err := js.Stream(ctx, g.stream)
		if err != nil {
			return ""
		}
		ci = s.CachedInfo().Cluster
	} else {
		con, err := js.Consumer(ctx, g.stream, g.consumer)
		if err != nil {
			return ""
		}
		ci = con.CachedInfo().Cluster
	}
	if ci == nil {
		return ""
	}
	return ci.Leader
}

// moveLeader makes node to the leader of g, by asking the current leader
// to step down in its favour, and waits (at most d) until it is. Moving
// every group of a semaphore off a node makes that node's loss cost no
// election: a SIGKILLed leader's groups answer nothing for 4 to 9 s.
func (c *seminitCluster) moveLeader(g raftGroup, to int, d time.Duration) {
	c.t.Helper()
	subject := "$JS.API.STREAM.LEADER.STEPDOWN." + g.stream
	if g.consumer != "" {
		subject = "$JS.API.CONSUMER.LEADER.STEPDOWN." + g.stream + "." + g.consumer
	}
	req := []byte(`{"placement":{"preferred":"` + c.nodes[to].name + `"}}`)
	deadline := time.Now().Add(d)
	var last string
	for c.askLeader(to, g) != c.nodes[to].name {
		if time.Now().After(deadline) {
			c.t.Fatalf("%s not led by %s within %v; last step-down answer: %s", g, c.nodes[to].name, d, last)
		}
		if nc, err := c.connect(to); err != nil {
			last = err.Error()
		} else {
			if m, err := nc.Request(subject, req, time.Second); err != nil {
				last = err.Error()
			} else {
				last = string(m.Data)
			}
			nc.Close()
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// connect connects to node i alone, without reconnecting.
func (c *seminitCluster) connect(i int) (*nats.Conn, error) {
	return nats.Connect(c.nodes[i].url, nats.Timeout(time.Second), nats.NoReconnect())
}

// TestClusterNodeLoss: three `seminit server` nodes form a cluster; a
// semaphore of 2 permits replicated on all three is created through one
// node and used through another; while a holder keeps one permit, a third
// node is SIGKILLed and the other permit is still obtainable; the killed
// node comes back on its store and reports the holder.
func TestClusterNodeLoss(t *testing.T) {
	t.Parallel()
	c := startCluster(t, 3)
	name := uniqueName(t)
	c.broker(0).mustInit(t, name, 2, "--replicas", "3")

	const client = 1 // the node the commands below go through
	if r := c.broker(client).seminit(t, "status", "--name", name); r.code != exitOK || !strings.Contains(r.stdout, "tokens 2,") {
		t.Fatalf("status through %s: %v", c.nodes[client].name, r)
	}
	if r := c.broker(client).seminit(t, "exec", "--name", name, "--wait", "10s", "--", "true"); r.code != exitOK {
		t.Fatalf("exec through %s: %v", c.nodes[client].name, r)
	}

	// A holder keeps one permit through the node loss.
	holder := startSeminit(t, c.broker(client).env(), "exec", "--name", name, "--", "sleep", "60")
	eventually(t, 10*time.Second, "a permit held", func() bool {
		r := c.broker(client).seminit(t, "status", "--name", name)
		return !holder.exited() && strings.Contains(r.stdout, "held 1,")
	})

	// Lead everything the semaphore needs from the client's node, then
	// kill another: the two left keep a majority, and no election is due.
	for _, g := range semaphoreGroups(name) {
		c.moveLeader(g, client, 10*time.Second)
	}
	victim := (client + 1) % len(c.nodes)
	c.kill(victim)
	if l := c.streamLeader(natssem.ResourcesOf(name, "").Stream, 5*time.Second); l != client {
		t.Fatalf("token stream led by %s after %s was killed, want %s", c.nodes[l].name, c.nodes[victim].name, c.nodes[client].name)
	}

	// One permit held, the other still obtainable through a survivor.
	if r := c.broker(client).seminit(t, "exec", "--name", name, "--wait", "15s", "--", "true"); r.code != exitOK {
		t.Fatalf("exec through %s with %s and a holder: %v", c.nodes[client].name, c.nodes[victim].name, r)
	}
	c.restart(victim)
	// Until its replicas catch up, the restarted node can answer with
	// older records (seen: the released slot still held), so poll.
	eventually(t, 10*time.Second, "status through restarted "+c.nodes[victim].name, func() bool {
		r := c.broker(victim).seminit(t, "status", "--name", name)
		if r.code == exitOK && strings.Contains(r.stdout, "tokens 2, available 1, held 1,") {
			return true
		}
		t.Logf("status through restarted %s, not caught up: %v", c.nodes[victim].name, r)
		return false
	})
	if holder.exited() {
		t.Fatalf("holder: %v", holder.res)
	}
}

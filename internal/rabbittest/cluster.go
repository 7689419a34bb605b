//go:build unix

package rabbittest

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// ClusterEnv names the AMQP URLs of the 3-node RabbitMQ clusters that
// .ci/rabbitmq-cluster.sh starts: per cluster, the comma-separated URLs of
// nodes tsa, tsb, tsc, in that order; clusters separated by ";", the K-th
// being the script's TOKENSEM_RMQ_CLUSTER=K (by position: a list naming
// only the second cluster would be taken for the first). go test runs
// several test binaries at once (-p, 2 on CI's 2 cores): with two
// clusters, a test that kills nodes need not wait for another binary's.
const ClusterEnv = "RABBITMQ_CLUSTER_URLS"

// Cluster is one 3-node RabbitMQ cluster of .ci/rabbitmq-cluster.sh.
type Cluster struct {
	URLs   []string // one per node, in Nodes order
	script string
	k      int // the script's TOKENSEM_RMQ_CLUSTER
}

// Nodes are the cluster's node names, in URL order.
var Nodes = []string{"tsa", "tsb", "tsc"}

// tryLockCluster takes, without waiting, an exclusive lock on a file
// beside cluster k's data (flock: released by the kernel if the process
// dies; two opens of the file exclude each other in one process too) and
// returns its release, or nil if another test holds it.
func tryLockCluster(k int) (func(), error) {
	dir := strings.TrimSuffix(os.Getenv("TOKENSEM_RMQ_CLUSTER_DIR"), "/")
	if dir == "" {
		dir = "/tmp/tokensem-rmq-cluster"
	}
	if k != 1 {
		dir = fmt.Sprintf("%s-%d", dir, k) // as the script names it
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(dir, "tests.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	switch err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); {
	case errors.Is(err, syscall.EWOULDBLOCK):
		_ = f.Close()
		return nil, nil
	case err != nil:
		_ = f.Close()
		return nil, err
	}
	return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); _ = f.Close() }, nil
}

// NeedCluster returns a cluster of $RABBITMQ_CLUSTER_URLS and holds it
// for t alone until t ends (tests that kill its nodes must not overlap),
// waiting for the first to be free. Without the variable it skips t, or
// fails it under CI=true.
func NeedCluster(t testing.TB) *Cluster {
	t.Helper()
	raw := os.Getenv(ClusterEnv)
	if raw == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and no RabbitMQ cluster: set %s (bash .ci/rabbitmq-cluster.sh prints it)", ClusterEnv)
		}
		t.Skipf("no RabbitMQ cluster: set %s=$(bash .ci/rabbitmq-cluster.sh)", ClusterEnv)
	}
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "..", ".ci", "rabbitmq-cluster.sh")
	var clusters []*Cluster
	for i, list := range strings.Split(raw, ";") {
		urls := strings.Split(strings.TrimSpace(list), ",")
		if len(urls) != len(Nodes) {
			t.Fatalf("%s: cluster %d has %d URLs, want %d", ClusterEnv, i+1, len(urls), len(Nodes))
		}
		clusters = append(clusters, &Cluster{URLs: urls, script: script, k: i + 1})
	}
	start := time.Now()
	for {
		waited := time.Since(start)
		for _, c := range clusters {
			unlock, err := tryLockCluster(c.k)
			if err != nil {
				t.Fatalf("lock RabbitMQ cluster %d: %v", c.k, err)
			}
			if unlock == nil {
				continue
			}
			if waited >= clusterPoll { // not on the first try
				t.Logf("waited %v for RabbitMQ cluster %d", waited.Round(time.Second), c.k)
			}
			t.Cleanup(func() {
				// Leave every node running for the next test.
				if err := c.Start(Nodes...); err != nil {
					t.Errorf("restart the cluster's nodes: %v", err)
				}
				unlock()
			})
			return c
		}
		if waited >= clusterWaitMax {
			t.Fatalf("each of the %d RabbitMQ clusters of %s was held by another test for %v", len(clusters), ClusterEnv, clusterWaitMax)
		}
		time.Sleep(clusterPoll)
	}
}

// clusterPoll is how often NeedCluster tries the clusters' locks while
// every one is held; clusterWaitMax bounds its wait (the longest test that
// holds a cluster takes a few minutes beside two CPU hogs).
const (
	clusterPoll    = 100 * time.Millisecond
	clusterWaitMax = 15 * time.Minute
)

// URL returns the URL of node (a name of Nodes).
func (c *Cluster) URL(node string) string {
	for i, n := range Nodes {
		if n == node {
			return c.URLs[i]
		}
	}
	panic("rabbittest: no node " + node)
}

// URLsFrom returns every node's URL, node's first: the list a client of
// that node fails over with.
func (c *Cluster) URLsFrom(node string) string {
	list := []string{c.URL(node)}
	for _, u := range c.URLs {
		if u != list[0] {
			list = append(list, u)
		}
	}
	return strings.Join(list, ",")
}

// Kill SIGKILLs the nodes and returns once they are gone.
func (c *Cluster) Kill(nodes ...string) error {
	_, err := c.run(append([]string{"kill"}, nodes...)...)
	return err
}

// Stop stops the nodes gracefully (rabbitmqctl stop).
func (c *Cluster) Stop(nodes ...string) error {
	_, err := c.run(append([]string{"stop"}, nodes...)...)
	return err
}

// Start starts those of the nodes that are stopped or killed, on their
// data, and returns once they accept AMQP.
func (c *Cluster) Start(nodes ...string) error {
	var down []string
	for _, n := range nodes {
		if _, err := c.run("pid", n); err != nil {
			down = append(down, n)
		}
	}
	if len(down) == 0 {
		return nil
	}
	_, err := c.run(append([]string{"start"}, down...)...)
	return err
}

// Leader returns the node leading quorum queue q.
func (c *Cluster) Leader(q string) (string, error) {
	out, err := c.run("leader", q)
	return strings.TrimSpace(out), err
}

// Ctl runs rabbitmqctl against node and returns its output.
func (c *Cluster) Ctl(node string, args ...string) (string, error) {
	return c.run(append([]string{"ctl", node}, args...)...)
}

func (c *Cluster) run(args ...string) (string, error) {
	var out, stderr bytes.Buffer
	cmd := exec.Command("bash", append([]string{c.script}, args...)...)
	cmd.Env = append(os.Environ(), fmt.Sprintf("TOKENSEM_RMQ_CLUSTER=%d", c.k))
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("rabbitmq-cluster.sh %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out.String(), nil
}

//go:build unix

package rabbittest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// ClusterEnv names the comma-separated AMQP URLs of the 3-node RabbitMQ
// cluster that .ci/rabbitmq-cluster.sh starts (nodes tsa, tsb, tsc, in that
// order).
const ClusterEnv = "RABBITMQ_CLUSTER_URLS"

// Cluster is the 3-node RabbitMQ cluster of .ci/rabbitmq-cluster.sh.
type Cluster struct {
	URLs   []string // one per node, in Nodes order
	script string
}

// Nodes are the cluster's node names, in URL order.
var Nodes = []string{"tsa", "tsb", "tsc"}

// clusterMu serializes the tests of this process that stop nodes of the
// one cluster; lockCluster serializes them across the test binaries that
// go test runs at once.
var clusterMu sync.Mutex

// lockCluster takes an exclusive lock on a file beside the cluster's data
// (flock: released by the kernel if the process dies) and returns its
// release.
func lockCluster() (func(), error) {
	dir := os.Getenv("TOKENSEM_RMQ_CLUSTER_DIR")
	if dir == "" {
		dir = "/tmp/tokensem-rmq-cluster"
	}
	f, err := os.OpenFile(filepath.Join(dir, "tests.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		_ = f.Close()
		return nil, err
	}
	return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); _ = f.Close() }, nil
}

// NeedCluster returns the cluster of $RABBITMQ_CLUSTER_URLS and holds it
// for t alone until t ends (tests that kill its nodes must not overlap).
// Without the variable it skips t, or fails it under CI=true.
func NeedCluster(t testing.TB) *Cluster {
	t.Helper()
	raw := os.Getenv(ClusterEnv)
	if raw == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and no RabbitMQ cluster: set %s (bash .ci/rabbitmq-cluster.sh prints it)", ClusterEnv)
		}
		t.Skipf("no RabbitMQ cluster: set %s=$(bash .ci/rabbitmq-cluster.sh)", ClusterEnv)
	}
	urls := strings.Split(raw, ",")
	if len(urls) != len(Nodes) {
		t.Fatalf("%s has %d URLs, want %d", ClusterEnv, len(urls), len(Nodes))
	}
	_, file, _, _ := runtime.Caller(0)
	c := &Cluster{URLs: urls, script: filepath.Join(filepath.Dir(file), "..", "..", ".ci", "rabbitmq-cluster.sh")}
	clusterMu.Lock()
	unlock, err := lockCluster()
	if err != nil {
		clusterMu.Unlock()
		t.Fatalf("lock the RabbitMQ cluster: %v", err)
	}
	t.Cleanup(func() {
		// Leave every node running for the next test.
		if err := c.Start(Nodes...); err != nil {
			t.Errorf("restart the cluster's nodes: %v", err)
		}
		unlock()
		clusterMu.Unlock()
	})
	return c
}

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
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("rabbitmq-cluster.sh %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out.String(), nil
}

package natstest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// StartProcessCluster is StartCluster with each node a `seminit server`
// process: the same nats-server, built once per test process without the
// race detector. Inside a test binary built with -race an embedded
// cluster's servers run instrumented too: the natssem conformance suite on
// a cluster spent 60 s of CPU in-process, most of it in the servers, which
// no test of this module checks for races. Call RemoveBinaries when the
// tests are done.
func StartProcessCluster(ctx context.Context, n int, dir string) (*Cluster, error) {
	if _, err := seminitBinary(); err != nil {
		return nil, err
	}
	return startCluster(ctx, &Cluster{name: "tokensem-test", procs: make([]*node, n)}, n, dir)
}

var binary struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// seminitBinary builds cmd/seminit once per process and returns its path.
func seminitBinary() (string, error) {
	binary.once.Do(func() {
		if binary.dir, binary.err = os.MkdirTemp("", "natstest-bin-*"); binary.err != nil {
			return
		}
		binary.path = filepath.Join(binary.dir, "seminit")
		// -race is not in GOFLAGS unless a caller put it there: go test
		// passes it to the test binary's build only.
		out, err := exec.Command("go", "build", "-o", binary.path, "github.com/tokensem/tokensem/cmd/seminit").CombinedOutput()
		if err != nil {
			binary.err = fmt.Errorf("natstest: go build seminit: %w\n%s", err, out)
		}
	})
	return binary.path, binary.err
}

// RemoveBinaries removes what StartProcessCluster and StartOlder built.
func RemoveBinaries() {
	if binary.dir != "" {
		_ = os.RemoveAll(binary.dir)
	}
	older.mu.Lock()
	defer older.mu.Unlock()
	for _, d := range older.dirs {
		_ = os.RemoveAll(d)
	}
}

// node is one `seminit server` process of a cluster.
type node struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has been waited for
	mu     sync.Mutex
	out    bytes.Buffer // stdout and stderr, for errors
}

// readyLine is what `seminit server` prints once it accepts clients.
const readyLine = "seminit: NATS JetStream listening on"

// startNode starts a node and waits until it accepts clients. It is
// killed if the test process dies (see setDeathSignal).
func startNode(listen, store, name, cluster, clusterListen, routes string) (*node, error) {
	bin, err := seminitBinary()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "server", "--listen", listen, "--store", store, "--sync", "interval",
		"--server-name", name, "--cluster-name", cluster, "--cluster-listen", clusterListen, "--routes", routes)
	setDeathSignal(cmd)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	n := &node{cmd: cmd, exited: make(chan struct{})}
	cmd.Stderr = n
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			_, _ = n.Write([]byte(line + "\n"))
			if strings.HasPrefix(line, readyLine) {
				close(ready)
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		_ = cmd.Wait()
		close(n.exited)
	}()
	select {
	case <-ready:
		return n, nil
	case <-n.exited:
		return nil, fmt.Errorf("seminit server exited: %v: %s", cmd.ProcessState, n.output())
	case <-time.After(30 * time.Second):
		n.stop()
		return nil, fmt.Errorf("seminit server not ready after 30 s: %s", n.output())
	}
}

func (n *node) Write(p []byte) (int, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.out.Write(p)
}

func (n *node) output() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return strings.TrimSpace(n.out.String())
}

// stop shuts the node down cleanly (SIGTERM), as an embedded server's
// Shutdown does, and kills it if it has not exited within 20 s.
func (n *node) stop() {
	if err := n.cmd.Process.Signal(os.Interrupt); err != nil && !errors.Is(err, os.ErrProcessDone) {
		_ = n.cmd.Process.Kill()
	}
	select {
	case <-n.exited:
	case <-time.After(20 * time.Second):
		_ = n.cmd.Process.Kill()
		<-n.exited
	}
}

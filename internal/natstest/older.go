package natstest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/tokensem/tokensem/internal/freeport"
)

// OlderServer is the nats-server release before 2.12 that the tests hold
// natssem to: a semaphore made there serves waiters in arrival order only,
// and its JetStream API differs in places (a batched direct get from a
// sequence the stream no longer holds).
const OlderServer = "v2.11.9"

var older struct {
	mu    sync.Mutex
	paths map[string]string
	errs  map[string]error
	dirs  []string // removed by RemoveBinaries
}

// olderBinary builds nats-server at version with the go command (from the
// module proxy) once per process.
func olderBinary(version string) (string, error) {
	older.mu.Lock()
	defer older.mu.Unlock()
	if p, ok := older.paths[version]; ok {
		return p, older.errs[version]
	}
	if older.paths == nil {
		older.paths, older.errs = map[string]string{}, map[string]error{}
	}
	dir, err := os.MkdirTemp("", "natstest-older-*")
	if err == nil {
		cmd := exec.Command("go", "install", "github.com/nats-io/nats-server/v2@"+version)
		// Outside this module's build: no -race, no -mod from the caller.
		cmd.Env = append(os.Environ(), "GOBIN="+dir, "GOFLAGS=-buildvcs=false")
		if out, ierr := cmd.CombinedOutput(); ierr != nil {
			err = fmt.Errorf("natstest: go install nats-server@%s: %w\n%s", version, ierr, out)
		}
	}
	older.paths[version], older.errs[version] = filepath.Join(dir, "nats-server"), err
	if dir != "" {
		older.dirs = append(older.dirs, dir)
	}
	return older.paths[version], err
}

// StartOlder starts a single nats-server of version (with JetStream, its
// store in a test directory) as a process for t and returns its URL. A
// server that cannot be built (no module proxy) skips t, and fails it
// under CI=true. It is stopped when t ends.
func StartOlder(t *testing.T, version string) string {
	t.Helper()
	bin, err := olderBinary(version)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	addr := freeport.Need(t, 1)[0]
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-a", host, "-p", port, "-js", "-sd", t.TempDir())
	setDeathSignal(cmd)
	n := &node{cmd: cmd, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = n, n
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait(); close(n.exited) }()
	t.Cleanup(n.stop)
	url := "nats://" + addr
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			_ = c.Close()
			break
		}
		select {
		case <-n.exited:
			t.Fatalf("nats-server %s exited: %s", version, n.output())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("nats-server %s not listening after 30 s: %s", version, n.output())
		}
	}
	if err := waitJetStream(t.Context(), url); err != nil {
		t.Fatalf("nats-server %s: %v", version, err)
	}
	return url
}

package httpsem_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/semtest"
	"github.com/tokensem/tokensem/internal/testenv"
	"github.com/tokensem/tokensem/natssem"
	"github.com/tokensem/tokensem/natssem/embedded"
)

// srv is the embedded NATS server every test in this package talks to.
var srv *embedded.Server

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, testenv.NATS, func(b testenv.Brokers) { srv = b.NATS }))
}

var nameSeq atomic.Int64

// uniqueName returns a semaphore name no other test uses.
func uniqueName(prefix string) string {
	return prefix + strconv.FormatInt(nameSeq.Add(1), 10)
}

// connect returns a NATS connection closed when the test ends.
func connect(t *testing.T) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// newSem creates a semaphore of n permits on its own connection.
func newSem(t *testing.T, nc *nats.Conn, n int, opts ...natssem.Option) *natssem.Semaphore {
	t.Helper()
	s, err := natssem.Init(bounded(t), nc, uniqueName("http"), n, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// bounded returns a context that ends with the test or after 30 s.
func bounded(t *testing.T) context.Context { return semtest.Context(t, 30*time.Second) }

// serve runs h on a test HTTP server and returns a client for it; both are
// shut down when the test ends.
func serve(t *testing.T, h http.Handler) (*httptest.Server, *http.Client) {
	t.Helper()
	ts := httptest.NewServer(h)
	client := &http.Client{Transport: &http.Transport{}, Timeout: 30 * time.Second}
	t.Cleanup(func() {
		client.CloseIdleConnections()
		ts.Close()
	})
	return ts, client
}

// waitFor polls cond until it holds, failing the test after 20 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// settled polls until s has no holder and all n permits are available.
func settled(t *testing.T, s tokensem.Semaphore, n int) {
	t.Helper()
	var st tokensem.Status
	waitFor(t, "every permit back", func() bool {
		var err error
		st, err = s.Status(bounded(t))
		return err == nil && st.Available == n && st.Held == 0
	})
}

// gauge counts handlers running at once and remembers the most.
type gauge struct {
	now, max, total atomic.Int64
}

func (g *gauge) enter() {
	g.total.Add(1)
	n := g.now.Add(1)
	for {
		m := g.max.Load()
		if n <= m || g.max.CompareAndSwap(m, n) {
			return
		}
	}
}

func (g *gauge) leave() { g.now.Add(-1) }

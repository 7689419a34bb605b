package natssem

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokensem/tokensem"
)

// TestInitRefusedReplicas: a single server refuses replicated streams for
// good. Init fails at once with tokensem.ErrRefused naming the reason (it
// used to retry it as a broker that did not answer until ctx ended), and
// leaves no semaphore behind.
func TestInitRefusedReplicas(t *testing.T) {
	srv := startServer(t)
	ctx := testContext(t)
	nc := dial(t, srv)
	_, err := Init(ctx, nc, "replicated", 2, WithReplicas(3))
	if !errors.Is(err, tokensem.ErrRefused) || errors.Is(err, tokensem.ErrUnavailable) {
		t.Fatalf("Init with 3 replicas on one server: %v, want ErrRefused and not ErrUnavailable", err)
	}
	if !strings.Contains(err.Error(), "replicas > 1 not supported") || !strings.Contains(err.Error(), "1 replica") {
		t.Errorf("error %q does not name the reason and the fix", err)
	}
	if _, err := Open(ctx, nc, "replicated"); !errors.Is(err, tokensem.ErrNotInitialized) {
		t.Fatalf("Open after the refused Init: %v, want ErrNotInitialized", err)
	}
}

// TestSilentScanIsTransient: a census read the broker leaves unanswered
// for a request timeout is a broker that did not answer, which Init,
// Status and Delete retry; only the caller's own context ending is its
// error. It used to return the bare deadline, and a loaded machine's Init
// failed with "reading tokens of …: context deadline exceeded".
func TestSilentScanIsTransient(t *testing.T) {
	srv := startServer(t)
	s, err := newSemaphore(dial(t, srv), "silent", mustOptions(t, WithRequestTimeout(20*time.Millisecond)))
	if err != nil {
		t.Fatal(err)
	}
	never := make(chan *nats.Msg)
	if _, err := s.nextScanned(testContext(t), never); !transient(err) {
		t.Errorf("a scan left unanswered: %v, want a transient broker error", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := s.nextScanned(ctx, never); !errors.Is(err, context.Canceled) || transient(err) {
		t.Errorf("a scan whose caller gave up: %v, want context.Canceled alone", err)
	}
}

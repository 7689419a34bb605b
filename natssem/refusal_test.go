package natssem

import (
	"errors"
	"strings"
	"testing"

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

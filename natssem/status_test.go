package natssem_test

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem/internal/semtest"
	"github.com/tokensem/tokensem/natssem"
)

// The lease lives in the configuration and, as AckWait, in the holders
// consumer. A consumer edited after Init is reported, not trusted.
func TestStatusWarnsOfEditedConsumer(t *testing.T) {
	s := initNATS(t, "edited", 1, natssem.WithLease(4*time.Second))
	ctx := semtest.Context(t, 30*time.Second)
	if st, err := s.Status(ctx); err != nil || len(st.Warnings) != 0 {
		t.Fatalf("fresh semaphore: warnings %q, err %v", st.Warnings, err)
	}
	js, err := jetstream.New(connect(t, srv.Addr().String()))
	if err != nil {
		t.Fatal(err)
	}
	c, err := js.Consumer(ctx, natssem.ResourcesOf("edited", "").Stream, "holders")
	if err != nil {
		t.Fatal(err)
	}
	cfg := c.CachedInfo().Config
	cfg.AckWait = 9 * time.Second
	if _, err := js.UpdateConsumer(ctx, natssem.ResourcesOf("edited", "").Stream, cfg); err != nil {
		t.Fatal(err)
	}
	st, err := s.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Warnings) != 1 || !strings.Contains(st.Warnings[0], "AckWait is 9s but the semaphore's lease is 4s") {
		t.Fatalf("warnings %q", st.Warnings)
	}
}

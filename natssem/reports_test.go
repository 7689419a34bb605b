package natssem_test

import (
	"testing"
	"time"

	"github.com/tokensem/tokensem/adaptive"
	"github.com/tokensem/tokensem/internal/semtest"
	"github.com/tokensem/tokensem/natssem"
)

// TestReportsReachTheController: a report a holder publishes reaches the
// subscriber of its semaphore only (not another semaphore's), and junk on
// the report subject is dropped, not handed on.
func TestReportsReachTheController(t *testing.T) {
	t.Parallel()
	ctx := semtest.Context(t, 30*time.Second)
	nc := connect(t, srv.Addr().String())
	a, err := natssem.Init(ctx, nc, "reports-a", 2)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := natssem.Init(ctx, nc, "reports-b", 2)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	got := make(chan adaptive.Report, 8)
	stop, err := a.SubscribeReports(ctx, got)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	pub := connect(t, srv.Addr().String())
	for _, junk := range [][]byte{[]byte("junk"), []byte(`{"from":"x","holds":-1}`), make([]byte, 4096)} {
		if err := pub.Publish("tokensem.reports-a.reports", junk); err != nil {
			t.Fatal(err)
		}
	}
	other := adaptive.Report{From: "b", Sample: adaptive.Sample{Limit: 2, Holds: 9}}
	want := adaptive.Report{From: "p1", Sample: adaptive.Sample{Limit: 2, Busy: 0.5, RTT: time.Millisecond, Holds: 4, Drops: 1}}
	if err := b.PublishReport(ctx, other); err != nil {
		t.Fatal(err)
	}
	if err := a.PublishReport(ctx, want); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		if r != want {
			t.Fatalf("received %+v, want %+v (junk or another semaphore's report came through)", r, want)
		}
	case <-ctx.Done():
		t.Fatal("the report never came")
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		t.Fatalf("a second report came: %+v", r)
	case <-time.After(100 * time.Millisecond):
	}
}

package amqpsem_test

import (
	"bytes"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem/adaptive"
	"github.com/tokensem/tokensem/amqpsem"
	"github.com/tokensem/tokensem/internal/faultproxy"
	"github.com/tokensem/tokensem/internal/semtest"
)

// TestReportsReachTheController: a report a holder publishes reaches the
// subscriber of its semaphore only (not another semaphore's); junk on the
// report key, a huge forged report included, is dropped, not handed on;
// and the subscription comes back after its connection is cut.
func TestReportsReachTheController(t *testing.T) {
	t.Parallel()
	ctx := semtest.Context(t, time.Minute)
	a, b := name(t)+"-a", name(t)+"-b"
	pa, pb := initAMQP(t, a, 2), initAMQP(t, b, 2)
	px, err := faultproxy.New(broker.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	sub, err := amqpsem.Open(ctx, dial(t, px.Addr(), 0), a)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	got := make(chan adaptive.Report, 8)
	stop, err := sub.SubscribeReports(ctx, got)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()

	// The junk is confirmed (enqueued, or dropped by the queue's cap)
	// before the reports go out on other connections: the 1 MiB message,
	// over the queue's byte cap, drops the messages ahead of it, and a
	// report that overtook it would go with them.
	ch := rawChannel(t)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for _, junk := range [][]byte{[]byte("junk"), []byte(`{"from":"x","holds":-1}`), bytes.Repeat([]byte("x"), 1<<20)} {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "tokensem."+a+".x", "tokensem."+a+".reports", false, false, amqp.Publishing{Body: junk})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := dc.WaitContext(ctx); err != nil {
			t.Fatal(err)
		}
	}
	want := adaptive.Report{From: "p1", Sample: adaptive.Sample{Limit: 2, Busy: 0.5, RTT: time.Millisecond, Holds: 4, Drops: 1}}
	if err := pb.PublishReport(ctx, adaptive.Report{From: "b", Sample: adaptive.Sample{Limit: 2, Holds: 9}}); err != nil {
		t.Fatal(err)
	}
	if err := pa.PublishReport(ctx, want); err != nil {
		t.Fatal(err)
	}
	receive := func(what string) {
		t.Helper()
		select {
		case r := <-got:
			if r != want {
				t.Fatalf("%s: received %+v, want %+v (junk or another semaphore's report came through)", what, r, want)
			}
		case <-ctx.Done():
			t.Fatalf("%s: the report never came", what)
		}
	}
	receive("first")
	select {
	case r := <-got:
		t.Fatalf("a second report came: %+v", r)
	case <-time.After(200 * time.Millisecond):
	}

	// The subscriber's connection is cut: it consumes again once it is
	// back. Reports published meanwhile may be lost; one comes through.
	px.Cut()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := pa.PublishReport(ctx, want); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-got:
			if r != want {
				t.Fatalf("after the cut: received %+v, want %+v", r, want)
			}
			return
		case <-time.After(250 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("no report came in 30 s after the subscriber's connection was cut")
		}
	}
}

// TestHugeReportNotReceived: a forged report of 60 MB published on the
// report key never reaches the controller's memory (a consumer would be
// handed it whole, whatever the queue's caps: the subscription takes its
// reports with basic.get, and the queue's cap drops it first), and the
// reports after it still come.
func TestHugeReportNotReceived(t *testing.T) {
	// Not parallel: the heap of the whole test process is measured.
	ctx := semtest.Context(t, time.Minute)
	n := name(t)
	s := initAMQP(t, n, 2)
	got := make(chan adaptive.Report, 8)
	stop, err := s.SubscribeReports(ctx, got)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	huge := bytes.Repeat([]byte("x"), oversized)
	ch := rawChannel(t)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	want := adaptive.Report{From: "p1", Sample: adaptive.Sample{Limit: 2, Holds: 3}}
	peak, _ := heapCost(func() {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "tokensem."+n+".x", "tokensem."+n+".reports", false, false, amqp.Publishing{Body: huge})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := dc.WaitContext(ctx); err != nil {
			t.Fatal(err)
		}
		if err := s.PublishReport(ctx, want); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-got:
			if r != want {
				t.Errorf("received %+v, want %+v", r, want)
			}
		case <-ctx.Done():
			t.Error("the report after the huge one never came")
		}
	})
	t.Logf("a %d-byte report and a good one: the heap grew by at most %d kB", len(huge), peak>>10)
	if peak > 10<<20 {
		t.Errorf("a %d-byte forged report: the heap grew by %d MB, want under 10 MB", len(huge), peak>>20)
	}
}

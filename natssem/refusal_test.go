package natssem

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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

// TestNoWaitPullOnAFullQueue: nats-server queues a no-wait pull that finds
// tokens pending for the pulls already queued (consumer.go,
// processNextMsgRequest), and answers 409 "Exceeded MaxWaiting" when the
// queue is full. For TryAcquire that means every ready token is promised
// to a waiter ahead: ErrNoPermit after a few tries, as with 408, never
// ErrTooManyWaiters, which its contract does not list (a loaded CI run met
// it in TestClusterGivenUpPullIsTakenOver). A waiting Acquire still gets
// ErrTooManyWaiters.
func TestNoWaitPullOnAFullQueue(t *testing.T) {
	srv := startServer(t)
	s, err := newSemaphore(dial(t, srv), "full", mustOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	full := &nats.Msg{Header: nats.Header{"Status": {"409"}, "Description": {"Exceeded MaxWaiting"}}}
	ctx := testContext(t)
	try := &acquisition{s: s, noWait: true}
	for i := 1; ; i++ {
		p, waitOn, err := try.answer(ctx, full)
		if p != nil || waitOn {
			t.Fatalf("answer %d: permit %v, wait on %v", i, p, waitOn)
		}
		if err != nil {
			if !errors.Is(err, tokensem.ErrNoPermit) || i != maxTryDeliveries {
				t.Fatalf("TryAcquire's answer %d to a full queue: %v, want ErrNoPermit at answer %d", i, err, maxTryDeliveries)
			}
			break
		}
	}
	wait := &acquisition{s: s}
	if _, _, err := wait.answer(ctx, full); !errors.Is(err, tokensem.ErrTooManyWaiters) {
		t.Errorf("Acquire's answer to a full queue: %v, want ErrTooManyWaiters", err)
	}
}

// TestUnansweredDirectGetIsTransient: a census's direct get that no server
// answers (503) while the token stream exists is a broker that cannot
// answer yet, as right after a replicated stream was made through another
// server of a cluster (its replicas' direct-get subscriptions still on
// their way), not a semaphore that does not exist: Status then said "not
// initialized" (a CI run of cmd/seminit's TestClusterNodeLoss). Here the
// stream stops serving direct gets; once it is gone, the census says not
// initialized.
func TestUnansweredDirectGetIsTransient(t *testing.T) {
	srv := startServer(t)
	ctx := testContext(t)
	nc := dial(t, srv)
	s, err := Init(ctx, nc, "nodirect", 2)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, s.lay.stream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.AllowDirect = false
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := s.scanTokens(ctx); !transient(err) || errors.Is(err, tokensem.ErrNotInitialized) {
		t.Fatalf("a direct get nobody answers, the stream there: %v, want a transient broker error", err)
	}
	if err := js.DeleteStream(ctx, s.lay.stream); err != nil {
		t.Fatal(err)
	}
	if _, err := s.scanTokens(ctx); !errors.Is(err, tokensem.ErrNotInitialized) {
		t.Fatalf("a direct get nobody answers, the stream gone: %v, want ErrNotInitialized", err)
	}
}

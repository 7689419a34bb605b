package natssem

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/driver"
	"github.com/tokensem/tokensem/natssem/embedded"
)

// The deadline rules of a claim, driven directly: what a claim does when
// its write is answered late.

func startServer(t *testing.T) *embedded.Server {
	t.Helper()
	srv, err := embedded.Start(embedded.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return srv
}

func dial(t *testing.T, srv *embedded.Server) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// deliver pulls one token of s without claiming it.
func deliver(t *testing.T, s *Semaphore) (*nats.Msg, delivery) {
	t.Helper()
	w, err := s.getWaiter(false, natsPriority(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.drop)
	if err := w.pull(true); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-w.ch:
		meta, err := m.Metadata()
		if err != nil {
			t.Fatalf("not a delivery: %v (%v)", err, m.Header)
		}
		tok, err := s.codec.Decode(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		return m, delivery{tok: tok, reply: m.Reply, seq: meta.Sequence.Stream, delivered: meta.NumDelivered, holder: "test-holder"}
	case <-time.After(5 * time.Second):
		t.Fatal("no delivery")
	}
	return nil, delivery{}
}

// A claim whose write landed with less than minHold of its lease left must
// not return a permit: it frees the record again and hands the token on.
func TestLateClaimHandsTheTokenOn(t *testing.T) {
	srv := startServer(t)
	ctx := testContext(t)
	const lease = 2 * time.Second
	s, err := Init(ctx, dial(t, srv), "late", 1, WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	m, d := deliver(t, s)
	d.rec = record{Holder: d.holder, Seq: d.seq, Token: d.tok.ID}
	d.sent = time.Now().Add(-(lease - safetyMargin(lease) - minHold(lease)/2)) // sent long ago
	rev, err := s.slots.cas(ctx, d.tok.Index, d.rec, 0, d.delivered)
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.won(ctx, m, d, rev, lease)
	if p != nil || err != nil {
		t.Fatalf("late claim made a permit (%v, %v)", p, err)
	}
	got, err := s.slots.read(ctx, d.tok.Index)
	if err != nil {
		t.Fatal(err)
	}
	if !got.rec.free() || got.rec.By != d.holder {
		t.Fatalf("record after a late claim = %+v; want freed by the claimer", got.rec)
	}
	other, err := Open(ctx, dial(t, srv), "late")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	q, err := other.TryAcquire(ctx)
	if err != nil {
		t.Fatalf("the token was not handed on: %v", err)
	}
	if q.Fence() <= rev {
		t.Errorf("next holder's fence %d not above the late claim's %d", q.Fence(), rev)
	}
	_ = q.Release(ctx)
}

// A permit made past its deadline is lost before anyone sees it.
func TestPermitPastItsDeadlineIsLost(t *testing.T) {
	srv := startServer(t)
	ctx := testContext(t)
	const lease = time.Second
	s, err := Init(ctx, dial(t, srv), "past", 1, WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, d := deliver(t, s)
	d.rec = record{Holder: d.holder, Seq: d.seq, Token: d.tok.ID}
	d.sent = time.Now().Add(-lease)
	rev, err := s.slots.cas(ctx, d.tok.Index, d.rec, 0, d.delivered)
	if err != nil {
		t.Fatal(err)
	}
	p := s.newPermit(d, rev, lease)
	select {
	case <-p.Done():
	default:
		t.Fatal("a permit past its deadline was returned open")
	}
	if !errors.Is(p.Err(), tokensem.ErrLeaseLost) {
		t.Fatalf("Err = %v, want ErrLeaseLost", p.Err())
	}
	if err := p.Release(ctx); !errors.Is(err, tokensem.ErrLeaseLost) {
		t.Fatalf("Release = %v, want ErrLeaseLost", err)
	}
}

// A request timeout as long as a holder's belief in its permit is refused,
// against the lease given to Init and the one stored (for Open).
func TestRequestTimeoutBoundedByLease(t *testing.T) {
	srv := startServer(t)
	ctx := testContext(t)
	nc := dial(t, srv)
	const lease = time.Second
	if _, err := Init(ctx, nc, "rt", 1, WithLease(lease), WithRequestTimeout(lease-lease/5)); !errors.Is(err, tokensem.ErrInvalidOption) {
		t.Fatalf("Init with request timeout 0.8 x lease: %v, want ErrInvalidOption", err)
	}
	if _, err := Open(ctx, nc, "rt"); !errors.Is(err, tokensem.ErrNotInitialized) {
		t.Fatalf("a refused Init left something behind: Open says %v", err)
	}
	s, err := Init(ctx, nc, "rt", 1, WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got, want := s.requestTimeout(), lease/4; got != want {
		t.Errorf("default request timeout for lease %v = %v, want %v", lease, got, want)
	}
	if _, err := Open(ctx, nc, "rt", WithRequestTimeout(900*time.Millisecond)); !errors.Is(err, tokensem.ErrInvalidOption) {
		t.Fatalf("Open with request timeout 0.9 x stored lease: %v, want ErrInvalidOption", err)
	}
	o, err := Open(ctx, nc, "rt", WithRequestTimeout(700*time.Millisecond))
	if err != nil {
		t.Fatalf("Open with request timeout 0.7 x lease: %v", err)
	}
	_ = o.Close()
}

// The lease is fixed when the semaphore is created: Init asking for
// another one is a mismatch; Init without WithLease uses the stored one.
func TestInitLeaseMismatch(t *testing.T) {
	srv := startServer(t)
	ctx := testContext(t)
	nc := dial(t, srv)
	if _, err := Init(ctx, nc, "fixed", 1, WithLease(4*time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := Init(ctx, nc, "fixed", 1, WithLease(6*time.Second)); !errors.Is(err, tokensem.ErrLeaseMismatch) {
		t.Fatalf("Init with another lease: err = %v, want ErrLeaseMismatch", err)
	}
	s, err := Init(ctx, nc, "fixed", 1)
	if err != nil {
		t.Fatal(err)
	}
	if s.Lease() != 4*time.Second {
		t.Fatalf("Init without WithLease: lease %v, want the stored 4s", s.Lease())
	}
}

// TestLatePermitRenewsNothing: a permit made after its deadline (a claim
// answered, then the process frozen before the permit was made) is lost
// before it is returned, and nothing of it may renew its slot record
// afterwards: its holder was told it holds nothing, and a renewal would keep
// the slot from everyone until the record fell silent, or for ever if the
// renewals went on.
func TestLatePermitRenewsNothing(t *testing.T) {
	srv := startServer(t)
	s, err := Init(testContext(t), dial(t, srv), "late-permit", 1, WithLease(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	d := delivery{tok: driver.NewToken(s.name, 0, 1), sent: time.Now().Add(-time.Minute)}
	p := s.newPermit(d, 1, 2*time.Second)
	if p.Err() == nil {
		t.Fatal("a permit made after its deadline is held")
	}
	select {
	case <-p.exited:
	default:
		t.Fatal("a permit lost at birth has renewals to come")
	}
	if p.ctx.Err() == nil {
		t.Fatal("a permit lost at birth may still write its record")
	}
}

package natssem_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/driver"
	"github.com/tokensem/tokensem/internal/semtest"
	"github.com/tokensem/tokensem/natssem"
)

func initNATS(t *testing.T, name string, permits int, opts ...natssem.Option) *natssem.Semaphore {
	t.Helper()
	s, err := natssem.Init(t.Context(), connect(t, srv.Addr().String()), name, permits, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// epochOf returns the epoch of s's current life, which its tokens carry.
func epochOf(t *testing.T, s tokensem.Semaphore) uint64 {
	t.Helper()
	st, err := s.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return st.Epoch
}

func openNATS(t *testing.T, name string) *natssem.Semaphore {
	t.Helper()
	s, err := natssem.Open(t.Context(), connect(t, srv.Addr().String()), name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// rawConsumer is a client that bypasses tokensem and talks to the token
// consumer directly, like a buggy or outdated client would.
func rawConsumer(t *testing.T, name string) jetstream.Consumer {
	t.Helper()
	js, err := jetstream.New(connect(t, srv.Addr().String()))
	if err != nil {
		t.Fatal(err)
	}
	c, err := js.Consumer(t.Context(), natssem.ResourcesOf(name, "").Stream, "holders")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func rawPublish(t *testing.T, name string, data []byte) {
	t.Helper()
	js, err := jetstream.New(connect(t, srv.Addr().String()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(t.Context(), natssem.ResourcesOf(name, "").Subject, data); err != nil {
		t.Fatal(err)
	}
}

// TestStaleNakDoesNotAdmitSecondHolder reproduces the hazard measured on
// nats-server: acks are matched by stream sequence only, so a stale holder's
// Nak hands a token to a third client while the current holder still has
// it. The slot record must keep the third client out.
func TestStaleNakDoesNotAdmitSecondHolder(t *testing.T) {
	const lease = time.Second
	name := "stale-nak"
	b := initNATS(t, name, 1, natssem.WithLease(lease))
	c := openNATS(t, name)

	// R takes the token behind tokensem's back and goes silent.
	batch, err := rawConsumer(t, name).Fetch(1, jetstream.FetchMaxWait(2*time.Second), jetstream.FetchPriorityGroup("tokensem"))
	if err != nil {
		t.Fatal(err)
	}
	var stale jetstream.Msg
	for m := range batch.Messages() {
		stale = m
	}
	if stale == nil {
		t.Fatal("raw fetch got no token")
	}
	// After R's ack wait expires the token is redelivered, and B holds it.
	pb, err := b.Acquire(semtest.Context(t, 10*lease))
	if err != nil {
		t.Fatal(err)
	}
	// R's stale Nak now makes the server deliver the token to C.
	cDone := make(chan error, 1)
	go func() {
		p, err := c.Acquire(semtest.Context(t, lease/2))
		if err == nil {
			_ = p.Release(context.Background())
			err = errors.New("C acquired while B holds the only permit")
		}
		cDone <- err
	}()
	time.Sleep(50 * time.Millisecond)
	if err := stale.Nak(); err != nil {
		t.Fatal(err)
	}
	if err := <-cDone; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("C: %v", err)
	}
	if pb.Err() != nil {
		t.Fatalf("B lost its permit: %v", pb.Err())
	}
	if err := pb.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	// The token is not lost: C gets it once B released (the stale
	// delivery C stepped away from comes back within a lease at worst).
	pc, err := c.Acquire(semtest.Context(t, 5*lease))
	if err != nil {
		t.Fatalf("token lost after the stale Nak: %v", err)
	}
	if pc.Fence() <= pb.Fence() {
		t.Fatalf("fence did not grow: %d then %d", pb.Fence(), pc.Fence())
	}
	_ = pc.Release(t.Context())
}

// TestDuplicateOfHeldSlotIsDeleted: a copy of a held slot's token is
// deleted when it surfaces, instead of admitting a second holder.
func TestDuplicateOfHeldSlotIsDeleted(t *testing.T) {
	name := "dup-held"
	s := initNATS(t, name, 1)
	p, err := s.Acquire(semtest.Context(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	copyTok, _ := driver.Codec{}.Encode(driver.NewToken(name, 0, epochOf(t, s)))
	rawPublish(t, name, copyTok)
	st, err := s.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st.Tokens != 2 || len(st.Duplicate) != 1 || st.Healthy {
		t.Fatalf("status with a duplicate: %+v", st)
	}
	if _, err := s.Acquire(semtest.Context(t, 500*time.Millisecond)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire with slot 0 held and its copy in the queue: %v", err)
	}
	st, err = s.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st.Tokens != 1 || len(st.Duplicate) != 0 || !st.Healthy {
		t.Fatalf("duplicate not removed: %+v", st)
	}
	_ = p.Release(t.Context())
}

// TestInvalidTokensAreRemoved: acquirers remove junk, foreign and retired
// tokens so they do not keep costing waiters their place.
func TestInvalidTokensAreRemoved(t *testing.T) {
	name := "invalid-removed"
	s := initNATS(t, name, 2)
	retired, _ := driver.Codec{}.Encode(driver.NewToken(name, 7, epochOf(t, s))) // index >= N
	oldEpoch, _ := driver.Codec{}.Encode(driver.NewToken(name, 0, epochOf(t, s)+1))
	for _, b := range [][]byte{[]byte("junk"), retired, oldEpoch} {
		rawPublish(t, name, b)
	}
	var ps []tokensem.Permit
	for range 2 {
		p, err := s.Acquire(semtest.Context(t, 5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	if _, err := s.TryAcquire(t.Context()); !errors.Is(err, tokensem.ErrNoPermit) {
		t.Fatalf("third permit: %v", err)
	}
	st, err := s.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st.Invalid != 0 || st.Tokens != 2 || !st.Healthy {
		t.Fatalf("invalid tokens left after acquirers passed them: %+v", st)
	}
	for _, p := range ps {
		_ = p.Release(t.Context())
	}
}

package natssem_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/semtest"
	"github.com/tokensem/tokensem/natssem"
	"github.com/tokensem/tokensem/natssem/embedded"
)

// groupStatus reads a key's Status until it shows want tokens, all
// available (a fresh key's consumer may count its tokens a moment late).
func groupStatus(t *testing.T, s *natssem.Semaphore, want int) tokensem.Status {
	t.Helper()
	ctx := semtest.Context(t, 10*time.Second)
	var st tokensem.Status
	for {
		var err error
		if st, err = s.Status(ctx); err != nil {
			t.Fatalf("status of %s: %v", s.Name(), err)
		}
		if st.Tokens == want && st.Available == want && st.Healthy || ctx.Err() != nil {
			return st
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestGroupKeyRemadeInsideDuplicateWindow: a key deleted and made again at
// once (well inside the stream's 2-minute duplicate window) gets its tokens;
// without the key's life in the message IDs the stream would drop the new
// tokens as duplicates of the first life's and the key would have none.
func TestGroupKeyRemadeInsideDuplicateWindow(t *testing.T) {
	const group, key = "remade", "k"
	in := natssem.WithGroup(group)
	nc := connect(t, srv.Addr().String())
	ctx := semtest.Context(t, time.Minute)
	for life := range 3 {
		s, err := natssem.Init(ctx, nc, key, 2, in)
		if err != nil {
			t.Fatalf("life %d: init: %v", life, err)
		}
		if st := groupStatus(t, s, 2); st.Tokens != 2 || st.Available != 2 || !st.Healthy {
			t.Fatalf("life %d: status %+v, want 2 tokens available", life, st)
		}
		p1, err := s.Acquire(ctx)
		if err != nil {
			t.Fatalf("life %d: acquire: %v", life, err)
		}
		p2, err := s.Acquire(ctx)
		if err != nil {
			t.Fatalf("life %d: second acquire: %v", life, err)
		}
		for _, p := range []tokensem.Permit{p1, p2} {
			if err := p.Release(ctx); err != nil {
				t.Fatalf("life %d: release: %v", life, err)
			}
		}
		_ = s.Close()
		if err := natssem.Delete(ctx, nc, key, in); err != nil {
			t.Fatalf("life %d: delete: %v", life, err)
		}
	}
}

// TestGroupKeysApart: keys of a group do not see each other's tokens,
// holders or deletion, and a delete of a key that never existed says so.
func TestGroupKeysApart(t *testing.T) {
	in := natssem.WithGroup("apart")
	nc := connect(t, srv.Addr().String())
	ctx := semtest.Context(t, time.Minute)
	a, err := natssem.Init(ctx, nc, "a", 1, in)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := natssem.Init(ctx, nc, "b", 2, in)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	pa, err := a.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if q, err := a.TryAcquire(ctx); !errors.Is(err, tokensem.ErrNoPermit) {
		t.Fatalf("a's second TryAcquire: %v, %v; want ErrNoPermit (b's tokens are not a's)", q, err)
	}
	if st := groupStatus(t, b, 2); st.Tokens != 2 || st.Held != 0 {
		t.Fatalf("b while a is held: %+v", st)
	}
	if _, err := natssem.Open(ctx, nc, "a"); !errors.Is(err, tokensem.ErrNotInitialized) {
		t.Fatalf("Open of a without its group: %v, want ErrNotInitialized (the key is not a semaphore of its own)", err)
	}
	if err := natssem.Delete(ctx, nc, "never", in); !errors.Is(err, tokensem.ErrNotInitialized) {
		t.Fatalf("Delete of a key that never existed: %v, want ErrNotInitialized", err)
	}
	if err := natssem.Delete(ctx, nc, "b", in); err != nil {
		t.Fatalf("delete b: %v", err)
	}
	infos, err := natssem.List(ctx, nc, in)
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 1 || infos[0].Name != "a" || infos[0].Permits != 1 || infos[0].State != "ready" {
		t.Fatalf("List of the group after b's delete: %+v, want a alone", infos)
	}
	if err := pa.Release(ctx); err != nil {
		t.Fatalf("a's release after b's delete: %v", err)
	}
	if st := groupStatus(t, a, 1); st.Tokens != 1 || st.Available != 1 {
		t.Fatalf("a after b's delete: %+v", st)
	}
}

// groupWithNeighbour makes group's stream and bucket with a key "other"
// in it (closed at the end of the test), and returns a connection, its
// JetStream context and the group's option.
func groupWithNeighbour(t *testing.T, group string) (*nats.Conn, jetstream.JetStream, natssem.Option) {
	t.Helper()
	nc := connect(t, srv.Addr().String())
	in := natssem.WithGroup(group)
	other, err := natssem.Init(semtest.Context(t, time.Minute), nc, "other", 1, in)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Close() })
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js, in
}

// TestGroupInitClearsLeftovers: messages an earlier life left on a key's
// subject (a seeding that stalled past a Delete, an operator's publish) are
// purged when the key is made, so its census starts clean.
func TestGroupInitClearsLeftovers(t *testing.T) {
	const group = "leftovers"
	key := fmt.Sprintf("k%d", time.Now().UnixNano()) // a new key each run (-count)
	nc, js, in := groupWithNeighbour(t, group)
	ctx := semtest.Context(t, time.Minute)
	for i := range 3 {
		if _, err := js.Publish(ctx, natssem.ResourcesOf(key, group).Subject, fmt.Appendf(nil, "leftover %d", i)); err != nil {
			t.Fatal(err)
		}
	}
	s, err := natssem.Init(ctx, nc, key, 2, in)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if st := groupStatus(t, s, 2); st.Tokens != 2 || st.Invalid != 0 {
		t.Fatalf("status of a key made over leftovers: %+v, want 2 tokens and nothing invalid", st)
	}
}

// TestGroupStaleConsumerGetsTheLease: a key's consumer left by an Init cut
// short (here made by hand with another ack wait) takes the lease of the
// life that is then created, so a holder's silence is noticed after that
// lease, not the stale one.
func TestGroupStaleConsumerGetsTheLease(t *testing.T) {
	const group, lease = "stale-consumer", 3 * time.Second
	key := fmt.Sprintf("k%d", time.Now().UnixNano()) // a new key each run (-count)
	nc, js, in := groupWithNeighbour(t, group)
	ctx := semtest.Context(t, time.Minute)
	if _, err := js.CreateConsumer(ctx, natssem.ResourcesOf("", group).Stream, jetstream.ConsumerConfig{
		Durable: "holders_" + key, FilterSubject: natssem.ResourcesOf(key, group).Subject,
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Hour,
	}); err != nil {
		t.Fatal(err)
	}
	s, err := natssem.Init(ctx, nc, key, 1, in, natssem.WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c, err := js.Consumer(ctx, natssem.ResourcesOf("", group).Stream, "holders_"+key)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.CachedInfo().Config.AckWait; got != lease {
		t.Fatalf("the key's consumer has an ack wait of %v, want the lease %v", got, lease)
	}
	p, err := s.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestGroupConsumerLimits: a group holds more keys than the server's
// default_max_consumers (set to 2 here; 1,000 by default), and a key beyond
// the account's own consumer limit fails at once with the broker's
// sentinel, naming the group, and leaves no configuration behind.
func TestGroupConsumerLimits(t *testing.T) {
	small, err := embedded.Start(embedded.Config{Options: func(o *server.Options) error {
		o.JetStreamLimits.DefaultMaxConsumers = 2
		o.JetStreamMaxStore = 1 << 30
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer small.Shutdown()
	nc := connect(t, small.Addr().String())
	ctx := semtest.Context(t, time.Minute)
	in := natssem.WithGroup("limits")
	for i := range 4 {
		s, err := natssem.Init(ctx, nc, fmt.Sprintf("k%d", i), 1, in)
		if err != nil {
			t.Fatalf("key %d of a group on a server whose default is 2 consumers a stream: %v", i, err)
		}
		_ = s.Close()
	}

	acct := small.NATS().GlobalAccount()
	if err := acct.UpdateJetStreamLimits(map[string]server.JetStreamAccountLimits{
		"": {MaxMemory: -1, MaxStore: -1, MaxStreams: -1, MaxConsumers: 6},
	}); err != nil {
		t.Fatal(err)
	}
	// Four keys, the two buckets' streams have no consumers, so two more
	// keys fit and the third does not.
	var last error
	for i := 4; i < 8 && last == nil; i++ {
		var s *natssem.Semaphore
		s, last = natssem.Init(ctx, nc, fmt.Sprintf("k%d", i), 1, in)
		if last == nil {
			_ = s.Close()
		}
	}
	if !errors.Is(last, jetstream.ErrMaximumConsumersLimit) || errors.Is(last, tokensem.ErrUnavailable) {
		t.Fatalf("Init beyond the account's consumer limit: %v, want ErrMaximumConsumersLimit (and no retrying)", last)
	}
	infos, err := natssem.List(ctx, nc, in)
	if err != nil {
		t.Fatal(err)
	}
	for _, info := range infos {
		if info.State != "ready" {
			t.Errorf("after a refused Init the group lists %+v", info)
		}
	}
	t.Logf("refused: %v; the group lists %d keys", last, len(infos))
}

// TestGroupMadeUnderAccountConsumerLimit: a group's first Init in an
// account whose consumer limit is below MaxGroupKeys makes the group's
// stream anyway (without a limit of its own: the server refuses a stream
// limit above the account's), and the account's limit then caps the keys.
func TestGroupMadeUnderAccountConsumerLimit(t *testing.T) {
	small, err := embedded.Start(embedded.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer small.Shutdown()
	if err := small.NATS().GlobalAccount().UpdateJetStreamLimits(map[string]server.JetStreamAccountLimits{
		"": {MaxMemory: -1, MaxStore: -1, MaxStreams: -1, MaxConsumers: 3},
	}); err != nil {
		t.Fatal(err)
	}
	nc := connect(t, small.Addr().String())
	ctx := semtest.Context(t, time.Minute)
	in := natssem.WithGroup("capped")
	for i := range 3 {
		s, err := natssem.Init(ctx, nc, fmt.Sprintf("k%d", i), 1, in)
		if err != nil {
			t.Fatalf("key %d in an account limited to 3 consumers: %v", i, err)
		}
		p, err := s.Acquire(ctx)
		if err != nil {
			t.Fatalf("key %d: acquire: %v", i, err)
		}
		if err := p.Release(ctx); err != nil {
			t.Fatalf("key %d: release: %v", i, err)
		}
		_ = s.Close()
	}
	if _, err := natssem.Init(ctx, nc, "k3", 1, in); !errors.Is(err, jetstream.ErrMaximumConsumersLimit) {
		t.Fatalf("a fourth key: %v, want ErrMaximumConsumersLimit", err)
	}
}

package natssem

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/driver"
	"github.com/tokensem/tokensem/natssem/embedded"
)

// configReads counts the reads of a group's bucket through the JetStream
// API (a leader read, as readLast does, or a direct get), by the record
// they read: every request on those subjects reaches this subscription
// too.
type configReads struct {
	nc, mon *nats.Conn
	msgs    chan *nats.Msg
}

func watchReads(t *testing.T, srv *embedded.Server, nc *nats.Conn, group string) *configReads {
	t.Helper()
	r := &configReads{nc: nc, mon: dial(t, srv), msgs: make(chan *nats.Msg, 1024)}
	for _, api := range []string{"STREAM.MSG.GET", "DIRECT.GET"} {
		sub, err := r.mon.ChanSubscribe("$JS.API."+api+".KV_"+ResourcesOf("", group).Bucket, r.msgs)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	if err := r.mon.Flush(); err != nil {
		t.Fatal(err)
	}
	return r
}

// take returns the reads since the last take, by record ("config" or
// generationKey). The client's connection is flushed first, then the
// monitor's: the server routes every request of the client to the monitor
// before it answers the monitor's ping.
func (r *configReads) take(t *testing.T) map[string]int {
	t.Helper()
	if err := r.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := r.mon.Flush(); err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for {
		select {
		case m := <-r.msgs:
			var req struct {
				LastBySubject string `json:"last_by_subj"`
			}
			if json.Unmarshal(m.Data, &req) != nil || req.LastBySubject == "" {
				counts["other"]++
				continue
			}
			counts[req.LastBySubject[strings.LastIndexByte(req.LastBySubject, '.')+1:]]++
		default:
			return counts
		}
	}
}

// warm takes every permit of each semaphore, then releases them: the first
// claim of a slot in a life confirms the life with a read of the
// configuration (claim.go, lifeChecked), which the tests of idle keys do
// not count. One permit was not enough: which slot's token a later
// acquire gets depends on timing, and the first claim of the other slot
// then read the configuration in the middle of a count.
func warm(t *testing.T, sems ...*Semaphore) {
	t.Helper()
	for _, s := range sems {
		var held []tokensem.Permit
		for range s.Permits() {
			p, err := s.Acquire(testContext(t))
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, p)
		}
		for _, p := range held {
			if err := p.Release(testContext(t)); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// Keys of a group used less often than configTTL admit by their cached
// configurations while the group's generation vouches for them: one read
// of the generation per connection, none of the configurations.
func TestGroupGenerationSavesConfigReads(t *testing.T) {
	srv := startServer(t)
	ctx := testContext(t)
	const group = "gen-reads"
	names := []string{"k1", "k2", "k3"}
	maker := dial(t, srv)
	for _, name := range names {
		s, err := Init(ctx, maker, name, 2, WithGroup(group))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
	}
	nc := dial(t, srv)
	var sems []*Semaphore
	for _, name := range names {
		s, err := Open(ctx, nc, name, WithGroup(group))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		sems = append(sems, s)
	}
	warm(t, sems...)
	reads := watchReads(t, srv, nc, group)
	time.Sleep(configTTL + 100*time.Millisecond)
	for round := range 2 {
		for _, s := range sems {
			p, err := s.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		got := reads.take(t)
		if got[configKey] != 0 || got[generationKey] != 1-round || got["other"] != 0 {
			t.Fatalf("round %d over %d idle keys read the bucket %v; want the generation %d times and nothing else",
				round, len(sems), got, 1-round)
		}
	}
}

// A resize of a key of a group reaches a client that trusts its cached
// count by the generation: the resize bumps the generation after writing
// the count, the client reads the generation past configTTL, finds it
// moved, and reads the count. Without the bump it would admit a retired
// token and hold two permits of a semaphore of one.
func TestGroupResizeReachesAClientTrustingTheGeneration(t *testing.T) {
	srv := startServer(t)
	ctx := testContext(t)
	const name, group = "gen-resize", "gen-resize-group"
	a, err := Init(ctx, dial(t, srv), name, 2, WithGroup(group))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Open(ctx, dial(t, srv), name, WithGroup(group))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if cfg := b.config(); !cfg.genKnown {
		t.Fatal("Open did not note the group's generation; the test needs a client that trusts it")
	}
	if _, err := a.Resize(ctx, 1); err != nil {
		t.Fatal(err)
	}
	reads := watchReads(t, srv, b.nc, group)
	time.Sleep(configTTL + 100*time.Millisecond)
	admitsByTheNewCount(t, b)
	// The generation moved, so the count was read once, after it.
	if got := reads.take(t); got[generationKey] < 1 || got[configKey] < 1 {
		t.Fatalf("the client read the bucket %v; want the generation, then the configuration", got)
	}
}

// A key deleted and made again with fewer permits reaches a client still
// holding a handle on its earlier life, which trusted its configuration by
// the generation: Delete bumps the generation after marking the key, and
// a configuration read while it is marked is not vouched for. Also when
// the first deleter died between its mark and its bump: the next Delete
// finds the mark and bumps.
func TestGroupRemadeKeyReachesAClientTrustingTheGeneration(t *testing.T) {
	t.Parallel()
	for _, died := range []bool{false, true} {
		t.Run(map[bool]string{false: "delete", true: "deleter died after marking"}[died], func(t *testing.T) {
			srv := startServer(t)
			ctx := testContext(t)
			const name, group = "gen-remade", "gen-remade-group"
			nc := dial(t, srv)
			a, err := Init(ctx, nc, name, 2, WithGroup(group))
			if err != nil {
				t.Fatal(err)
			}
			b, err := Open(ctx, dial(t, srv), name, WithGroup(group))
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			if !b.config().genKnown {
				t.Fatal("Open did not note the group's generation; the test needs a client that trusts it")
			}
			if died {
				// The mark alone, as a deleter that died before its bump left it.
				h, err := a.takeLock(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := a.markDeleting(ctx, h); err != nil {
					t.Fatal(err)
				}
				h.unlock() // the mark stays
			}
			_ = a.Close()
			if err := Delete(ctx, nc, name, WithGroup(group)); err != nil {
				t.Fatal(err)
			}
			a, err = Init(ctx, nc, name, 1, WithGroup(group))
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			time.Sleep(configTTL + 100*time.Millisecond)
			admitsByTheNewCount(t, b)
		})
	}
}

// admitsByTheNewCount publishes slot 1's token, retired by a count of 1,
// and checks that b, whose cached count is 2, admits by the count of 1:
// one permit, then no second.
func admitsByTheNewCount(t *testing.T, b *Semaphore) {
	t.Helper()
	ctx := testContext(t)
	if got := b.Permits(); got != 2 {
		t.Fatalf("the idle client already counts %d permits; the test needs its stale count of 2", got)
	}
	retired, err := driver.Codec{}.Encode(driver.NewToken(b.name, 1, b.config().Epoch))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.js.Publish(ctx, b.lay.subject, retired); err != nil {
		t.Fatal(err)
	}
	p, err := b.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Release(ctx) }()
	if q, err := b.TryAcquire(ctx); !errors.Is(err, tokensem.ErrNoPermit) {
		if err == nil {
			_ = q.Release(ctx)
		}
		t.Fatalf("a second permit after the count went from 2 to 1: TryAcquire = %v, want ErrNoPermit", err)
	}
	if got := b.Permits(); got != 1 {
		t.Fatalf("the client counts %d permits after admitting, want 1", got)
	}
}

// A Resize to the count a key already has, as a controller re-applying
// counts makes, leaves the generation alone once a bump covers the count:
// every bump makes every client of the group read its keys again.
func TestGroupResizeToTheSameCountKeepsTheGeneration(t *testing.T) {
	srv := startServer(t)
	ctx := testContext(t)
	s, err := Init(ctx, dial(t, srv), "gen-same", 2, WithGroup("gen-same-group"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Resize(ctx, 3); err != nil {
		t.Fatal(err)
	}
	before, err := s.readGeneration(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if before.seq == 0 {
		t.Fatal("a Resize to another count did not bump the generation")
	}
	for range 3 {
		if _, err := s.Resize(ctx, 3); err != nil {
			t.Fatal(err)
		}
	}
	if after, err := s.readGeneration(ctx); err != nil || after != before {
		t.Fatalf("generation %+v after Resizes to the same count, %+v before (err %v)", after, before, err)
	}
}

// The Inits of a group's keys on one connection look the group's stream
// and bucket up once (groupShare). If an operator removes them meanwhile,
// the next Init makes them again rather than failing on what it
// remembered.
func TestGroupInitAfterTheGroupWasRemoved(t *testing.T) {
	srv := startServer(t)
	ctx := testContext(t)
	const group = "gone-group"
	nc := dial(t, srv)
	a, err := Init(ctx, nc, "first", 2, WithGroup(group))
	if err != nil {
		t.Fatal(err)
	}
	_ = a.Close()
	if stream, _ := a.group.found(); stream == nil {
		t.Fatal("the Init did not remember the group's stream; the test needs it to")
	}
	if err := a.js.DeleteStream(ctx, ResourcesOf("", group).Stream); err != nil {
		t.Fatal(err)
	}
	if err := a.js.DeleteKeyValue(ctx, ResourcesOf("", group).Bucket); err != nil {
		t.Fatal(err)
	}
	b, err := Init(ctx, nc, "second", 2, WithGroup(group))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	p, err := b.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A key made before the generation (configuration version 1) keeps the
// per-key re-read: clients of that version neither bump nor read the
// generation, so it cannot vouch for the key.
func TestGroupVersion1KeyReadsItsConfiguration(t *testing.T) {
	srv := startServer(t)
	ctx := testContext(t)
	const name, group = "gen-v1", "gen-v1-group"
	a, err := Init(ctx, dial(t, srv), name, 2, WithGroup(group))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	cfg, rev, err := a.readConfig(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Version = configVersion
	if _, err := a.kv.Update(ctx, a.lay.key(configKey), cfg.encode(), rev); err != nil {
		t.Fatal(err)
	}
	nc := dial(t, srv)
	b, err := Open(ctx, nc, name, WithGroup(group))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if b.config().genKnown {
		t.Fatal("the generation vouches for a version-1 key")
	}
	warm(t, b)
	reads := watchReads(t, srv, nc, group)
	time.Sleep(configTTL + 100*time.Millisecond)
	p, err := b.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := reads.take(t); got[configKey] != 1 {
		t.Fatalf("an Acquire past configTTL on a version-1 key read the bucket %v; want its configuration once", got)
	}
}

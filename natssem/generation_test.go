package natssem

import (
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokensem/tokensem"
)

// configReads counts the leader reads (readLast) of a group's bucket, by
// the record they read: every request to the bucket stream's message-get
// subject reaches this subscription too.
type configReads struct {
	mu     sync.Mutex
	counts map[string]int // "config" or generationKey
}

func watchReads(t *testing.T, nc *nats.Conn, group string) *configReads {
	t.Helper()
	r := &configReads{counts: map[string]int{}}
	sub, err := nc.Subscribe("$JS.API.STREAM.MSG.GET.KV_"+GroupBucketName(group), func(m *nats.Msg) {
		var req struct {
			LastBySubject string `json:"last_by_subj"`
		}
		if json.Unmarshal(m.Data, &req) != nil {
			return
		}
		rec := req.LastBySubject[strings.LastIndexByte(req.LastBySubject, '.')+1:]
		r.mu.Lock()
		r.counts[rec]++
		r.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *configReads) take() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.counts
	r.counts = map[string]int{}
	return c
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
	reads := watchReads(t, dial(t, srv), group)
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
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond) // the monitor's connection is another
		got := reads.take()
		if got[configKey] != 0 || got[generationKey] != 1-round {
			t.Fatalf("round %d over %d idle keys read %d configurations and the generation %d times; want none and %d",
				round, len(sems), got[configKey], got[generationKey], 1-round)
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
	time.Sleep(configTTL + 100*time.Millisecond)
	admitsByTheNewCount(t, b, 1)
}

// A key deleted and made again with fewer permits reaches a client still
// holding a handle on its earlier life: Delete bumps the generation once
// the key is gone (Init does not).
func TestGroupRemadeKeyReachesAClientTrustingTheGeneration(t *testing.T) {
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
	admitsByTheNewCount(t, b, 1)
}

// admitsByTheNewCount publishes slot 1's token, retired by a count of 1,
// and checks that b, whose cached count is 2, admits by the count of 1:
// one permit, then no second.
func admitsByTheNewCount(t *testing.T, b *Semaphore, want int) {
	t.Helper()
	ctx := testContext(t)
	if got := b.Permits(); got != 2 {
		t.Fatalf("the idle client already counts %d permits; the test needs its stale count of 2", got)
	}
	retired, err := tokensem.Codec{}.Encode(tokensem.NewToken(b.name, 1, 1))
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
		t.Fatalf("a second permit after the count went to 1: TryAcquire = %v, want ErrNoPermit", err)
	}
	if got := b.Permits(); got != want {
		t.Fatalf("the client counts %d permits after admitting, want %d", got, want)
	}
}

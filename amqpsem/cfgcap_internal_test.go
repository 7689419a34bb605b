package amqpsem

import (
	"testing"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/ids"
	"github.com/tokensem/tokensem/internal/rabbittest"
)

// TestCappedConfigQueueTakesLargestRewrite: the configuration queue's cap
// (configQueueArgs) never drops a configuration amqpsem writes: a rewrite
// of one of nearly maxConfigSize over another of that size (the writer
// holds the old while it publishes the new) leaves the new one, alone.
func TestCappedConfigQueueTakesLargestRewrite(t *testing.T) {
	b := rabbittest.Need(t)
	ctx := t.Context()
	c, err := Dial(ctx, b.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	name := "cfgcap-rewrite-" + ids.New()[:8]
	s, err := Init(ctx, c, name, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ForceDelete(ctx, c, name) }()
	defer s.Close()
	lctx, unlock, err := s.lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	cfg, err := s.loadConfig(lctx)
	if err != nil {
		t.Fatal(err)
	}
	for round := range 2 {
		next := cfg
		next.Seq += 1 + round
		next.Reissued = map[int]reissue{}
		for i := range 13_000 {
			next.Reissued[tokensem.MaxPermits-1-i-round] = reissue{ID: ids.New(), Base: 1<<63 - 1}
		}
		size := len(next.encode())
		if size < maxConfigSize*9/10 || next.checkSize(name) != nil {
			t.Fatalf("round %d: %d bytes, want just under %d", round, size, maxConfigSize)
		}
		if err := s.writeConfig(lctx, next); err != nil {
			t.Fatalf("round %d: writing %d bytes: %v", round, size, err)
		}
		got, err := s.loadConfig(lctx)
		if err != nil || got.Seq != next.Seq || len(got.Reissued) != len(next.Reissued) {
			t.Fatalf("round %d: read back seq %d with %d reissued, %v; want seq %d", round, got.Seq, len(got.Reissued), err, next.Seq)
		}
		t.Logf("round %d: wrote and read back %d bytes", round, size)
		cfg = next
	}
}

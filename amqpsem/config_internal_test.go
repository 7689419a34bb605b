package amqpsem

import (
	"errors"
	"runtime"
	"testing"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/ids"
)

// TestConfigCaps: a configuration naming 10,000 reissued slots (as many
// repairs as a semaphore is likely to see) is written and read back, for
// less than 10 MB; one naming 14,000 would pass the cap, and is refused
// before it is written, so no reader ever refuses what a writer stored.
func TestConfigCaps(t *testing.T) {
	withReissued := func(n int) config {
		cfg := config{Version: configVersion, Seq: 1 << 40, State: stateReady, Permits: tokensem.MaxPermits, Epoch: ids.MaxEpoch - 1,
			KeyCheck: "0123456789abcdef", QueueType: Quorum, Created: 1 << 62, HoldBoundMS: maxHoldBound.Milliseconds(),
			FenceBase: 1 << 62, Issued: tokensem.MaxPermits, Reissued: map[int]reissue{}}
		for i := range n {
			cfg.Reissued[tokensem.MaxPermits-1-i] = reissue{ID: ids.New(), Base: 1<<63 - 1}
		}
		return cfg
	}
	big := withReissued(10_000)
	if err := big.checkSize("s"); err != nil {
		t.Fatalf("10,000 reissued slots: %v", err)
	}
	b := big.encode()
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	got, err := decodeConfig("s", b)
	runtime.ReadMemStats(&after)
	if err != nil || len(got.Reissued) != 10_000 {
		t.Fatalf("decode %d bytes of 10,000 reissued slots: %d slots, %v", len(b), len(got.Reissued), err)
	}
	if cost := after.TotalAlloc - before.TotalAlloc; cost > 10<<20 {
		t.Errorf("decoding %d bytes allocated %d MB", len(b), cost>>20)
	}
	t.Logf("10,000 reissued slots: %d bytes, decoded for %d kB", len(b), (after.TotalAlloc-before.TotalAlloc)>>10)
	if err := withReissued(14_000).checkSize("s"); !errors.Is(err, tokensem.ErrInvalidRecord) {
		t.Errorf("14,000 reissued slots: checkSize = %v, want ErrInvalidRecord", err)
	}
}

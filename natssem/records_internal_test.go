package natssem

import (
	"strings"
	"testing"
	"time"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/ids"
)

// TestLargestRecordsDecode: the largest records this package writes fit
// the caps with room to spare, so that no valid record is refused.
func TestLargestRecordsDecode(t *testing.T) {
	owner := strings.Repeat("<", 128) // the longest holder name, each byte escaped by JSON
	rec := record{Epoch: ids.MaxEpoch - 1, Holder: ids.New(), Owner: owner, Seq: 1<<64 - 1, Token: ids.New(), By: ids.New(), Deleted: true, Pending: true}
	if b := rec.encode(); len(b) > maxRecordSize/2 {
		t.Errorf("the largest slot record is %d bytes: too close to the cap %d", len(b), maxRecordSize)
	} else if got, err := decodeRecord(b); err != nil || got != rec {
		t.Errorf("decode the largest slot record: %+v, %v", got, err)
	}
	lock := mustMarshal(lockRecord{Holder: ids.New(), Owner: owner})
	if got := decodeLock(lock); got.Owner != owner || len(lock) > maxRecordSize/2 {
		t.Errorf("the largest lock record (%d bytes) decodes as %+v", len(lock), got)
	}
	cfg := config{Version: configVersionGen, Permits: tokensem.MaxPermits, Lease: tokensem.MaxLease, Epoch: ids.MaxEpoch - 1,
		KeyCheck: strings.Repeat("f", 16), State: stateDeleting, Seeder: ids.New(), Created: 1 << 62, Deleting: 1 << 62, Was: stateSeeding}
	if b := cfg.encode(); len(b) > maxConfigSize/4 {
		t.Errorf("the largest configuration is %d bytes: too close to the cap %d", len(b), maxConfigSize)
	} else if _, err := decodeConfig(b); err != nil {
		t.Errorf("decode the largest configuration: %v", err)
	}
	if _, err := decodeConfig(config{Version: configVersion, Permits: 1, Lease: time.Second, Epoch: 1, State: stateReady}.encode()); err != nil {
		t.Errorf("decode the smallest configuration: %v", err)
	}
}

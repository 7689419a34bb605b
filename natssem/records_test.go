package natssem_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/semtest"
	"github.com/tokensem/tokensem/natssem"
)

// TestInvalidSlotRecords: slot records a client does not write (100 kB of
// garbage, an epoch past 2^53) count as free and are named by Status; a
// record under a slot key far past any permit count ("slot.2000000000")
// is no slot at all. ForceDelete touches only the slots that exist: it
// does not walk the two billion slots below that key.
func TestInvalidSlotRecords(t *testing.T) {
	const name = "bad-slots"
	s := initNATS(t, name, 2, natssem.WithLease(2*time.Second))
	put := func(key string, value []byte) {
		replaceRecord(t, srv.Addr().String(), natssem.ResourcesOf(name, "").Bucket, key, func([]byte) []byte { return value })
	}
	put("slot.0", []byte(strings.Repeat("\x00garbage\xff", 10<<10)))
	put("slot.1", []byte(`{"e":1152921504606846976,"h":"forged","seq":1}`))
	put("slot.2000000000", []byte(`{"h":"forged","seq":1}`))

	st, err := s.Status(semtest.Context(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Warnings) != 1 || !strings.Contains(st.Warnings[0], "slots [0 1] are invalid") || len(st.Warnings[0]) > 512 {
		t.Errorf("status warnings %q, want one naming slots [0 1] as invalid", st.Warnings)
	}
	for range 2 {
		if _, err := s.TryAcquire(semtest.Context(t, 10*time.Second)); err != nil {
			t.Fatalf("TryAcquire with invalid slot records: %v (they count as free)", err)
		}
	}

	start := time.Now()
	if err := natssem.ForceDelete(semtest.Context(t, 20*time.Second), connect(t, srv.Addr().String()), name); err != nil {
		t.Fatalf("force delete: %v", err)
	}
	t.Logf("force delete took %v", time.Since(start).Round(time.Millisecond))
}

// TestOversizedLockRecord: an admin lock record larger than any client
// writes (100 kB naming a holder) is nobody's lock: a resize takes the
// lock at once instead of waiting for it to expire.
func TestOversizedLockRecord(t *testing.T) {
	const name = "big-lock"
	s := initNATS(t, name, 2)
	replaceRecord(t, srv.Addr().String(), natssem.ResourcesOf(name, "").Bucket, "lock", func([]byte) []byte {
		return []byte(`{"h":"someone","o":"` + strings.Repeat("x", 100<<10) + `"}`)
	})
	ctx := semtest.Context(t, 8*time.Second) // the lock expires after 15 s
	if _, err := s.Resize(ctx, 3); err != nil {
		t.Fatalf("resize past an oversized lock record: %v", err)
	}
	if st, err := s.Status(ctx); err != nil || st.Permits != 3 {
		t.Fatalf("after the resize: %+v, %v", st, err)
	}
}

// TestInvalidConfigFields: each field of the configuration is checked when
// read, and a bad one fails Open with ErrInvalidRecord saying which.
func TestInvalidConfigFields(t *testing.T) {
	const name = "bad-fields"
	initNATS(t, name, 2)
	var orig []byte
	replaceRecord(t, srv.Addr().String(), natssem.ResourcesOf(name, "").Bucket, "config", func(old []byte) []byte {
		orig = old
		return old
	})
	tests := []struct {
		name, field string
		value       any
		want        string // in the error
	}{
		{"zero permits", "permits", 0, "permits 0 outside"},
		{"too many permits", "permits", tokensem.MaxPermits + 1, "permits 1048577 outside"},
		{"short lease", "lease_ns", int64(time.Millisecond), "lease 1ms outside"},
		{"long lease", "lease_ns", int64(48 * time.Hour), "lease 48h0m0s outside"},
		{"zero epoch", "epoch", 0, "epoch 0 outside"},
		{"epoch past 2^53", "epoch", uint64(1) << 60, "epoch 1152921504606846976 outside"},
		{"unknown state", "state", "weird", `state "weird"`},
		{"unknown version", "v", 9, "version 9"},
		{"long seeder", "seeder", strings.Repeat("s", 1000), "seeder is 1000 bytes"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			replaceRecord(t, srv.Addr().String(), natssem.ResourcesOf(name, "").Bucket, "config", func([]byte) []byte {
				return semtest.EditJSON(t, orig, tc.field, tc.value)
			})
			_, err := natssem.Open(t.Context(), connect(t, srv.Addr().String()), name)
			if !errors.Is(err, tokensem.ErrInvalidRecord) || !strings.Contains(err.Error(), tc.want) || len(err.Error()) > 512 {
				t.Errorf("open: %v\nwant ErrInvalidRecord saying %q, at most 512 bytes", err, tc.want)
			}
		})
	}
	replaceRecord(t, srv.Addr().String(), natssem.ResourcesOf(name, "").Bucket, "config", func([]byte) []byte { return orig })
	if _, err := natssem.Open(t.Context(), connect(t, srv.Addr().String()), name); err != nil {
		t.Fatalf("open with the configuration put back: %v", err)
	}
}

package adaptive_test

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/adaptive"
)

// fullRecord is a record at every bound, of the characters JSON escapes
// longest (besides the control characters a record may not have).
func fullRecord() adaptive.Record {
	at := time.Date(2026, 11, 28, 3, 4, 5, 123456789, time.FixedZone("x", -9*3600-30*60))
	r := adaptive.Record{By: strings.Repeat(`"`, 96), Leader: strings.Repeat("l", tokensem.MaxNameLen),
		Min: tokensem.MaxPermits - 1, Max: tokensem.MaxPermits, Algorithm: strings.Repeat(`\`, 16), Since: at, At: at}
	for range adaptive.MaxChanges + 3 {
		r = r.Add(adaptive.Change{At: at, From: tokensem.MaxPermits, To: tokensem.MaxPermits, Why: strings.Repeat(`"<\`, 100)})
	}
	return r
}

// Clip makes any text fit a record: valid UTF-8, no control characters,
// at most n bytes, cut at a character.
func TestClip(t *testing.T) {
	for _, s := range []string{strings.Repeat("x", 92) + "→ab", strings.Repeat("é", 60), "bad \xff\xfe bytes\n\x00" + strings.Repeat("µ", 50), "short"} {
		got := adaptive.Clip(s, 96)
		if len(got) > 96 || !utf8.ValidString(got) || strings.IndexFunc(got, unicode.IsControl) >= 0 {
			t.Errorf("Clip(%q, 96) = %q (%d bytes)", s, got, len(got))
		}
		r := adaptive.Record{By: adaptive.Clip(s, 96), Leader: "x", Min: 1, Max: 2}.Add(adaptive.Change{From: 1, To: 2, Why: s})
		b, err := adaptive.EncodeRecord(r)
		if err != nil {
			t.Fatalf("a record of %q: %v", s, err)
		}
		if _, err := adaptive.DecodeRecord(b); err != nil {
			t.Errorf("a record of %q does not read back: %v", s, err)
		}
	}
	if got := adaptive.Clip("short", 96); got != "short" {
		t.Errorf("Clip cut a short text: %q", got)
	}
}

// A record at every bound encodes within MaxRecordLen and reads back the
// same; Add keeps the latest MaxChanges and cuts a long Why.
func TestRecordRoundTrip(t *testing.T) {
	r := fullRecord()
	if len(r.Changes) != adaptive.MaxChanges {
		t.Fatalf("%d changes kept; want %d", len(r.Changes), adaptive.MaxChanges)
	}
	b, err := adaptive.EncodeRecord(r)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("a record at every bound: %d bytes (at most %d)", len(b), adaptive.MaxRecordLen)
	got, err := adaptive.DecodeRecord(b)
	if err != nil {
		t.Fatal(err)
	}
	if !got.At.Equal(r.At) || got.By != r.By || len(got.Changes) != len(r.Changes) || got.Changes[0].Why != r.Changes[0].Why {
		t.Errorf("read back %+v; want %+v", got, r)
	}
	r = adaptive.Record{}.Add(adaptive.Change{From: 1, To: 2, Why: "a"})
	r = r.Add(adaptive.Change{From: 2, To: 3})
	if len(r.Changes) != 2 || r.Changes[0].To != 2 || r.Changes[1].To != 3 {
		t.Errorf("Add kept %+v; want 1→2, 2→3 in that order", r.Changes)
	}
}

// A record out of bounds is not written (ErrInvalidOption), and one read
// back out of bounds, malformed or too long is refused
// (ErrInvalidRecord).
func TestRecordRefused(t *testing.T) {
	ok := adaptive.Record{By: "me", Leader: "x-adapt", Min: 1, Max: 4}
	bad := map[string]func(*adaptive.Record){
		"no by":          func(r *adaptive.Record) { r.By = "" },
		"long by":        func(r *adaptive.Record) { r.By = strings.Repeat("b", 97) },
		"bad leader":     func(r *adaptive.Record) { r.Leader = "a b" },
		"min above max":  func(r *adaptive.Record) { r.Min = 5 },
		"zero min":       func(r *adaptive.Record) { r.Min = 0 },
		"max too large":  func(r *adaptive.Record) { r.Max = tokensem.MaxPermits + 1 },
		"long algorithm": func(r *adaptive.Record) { r.Algorithm = strings.Repeat("a", 17) },
		"bad change":     func(r *adaptive.Record) { r.Changes = []adaptive.Change{{From: 0, To: 2}} },
		"long why": func(r *adaptive.Record) {
			r.Changes = []adaptive.Change{{From: 1, To: 2, Why: strings.Repeat("w", 97)}}
		},
		"many changes": func(r *adaptive.Record) { r.Changes = make([]adaptive.Change, adaptive.MaxChanges+1) },
	}
	for what, spoil := range bad {
		r := ok
		spoil(&r)
		if _, err := adaptive.EncodeRecord(r); !errors.Is(err, tokensem.ErrInvalidOption) {
			t.Errorf("%s: EncodeRecord: %v; want ErrInvalidOption", what, err)
		}
	}
	for what, b := range map[string]string{
		"empty":     ``,
		"not JSON":  `{"by":`,
		"a number":  `7`,
		"no leader": `{"by":"me","min":1,"max":2}`,
		"too long":  `{"by":"me","leader":"x","min":1,"max":2,"algorithm":"` + strings.Repeat("a", adaptive.MaxRecordLen) + `"}`,
	} {
		if _, err := adaptive.DecodeRecord([]byte(b)); !errors.Is(err, tokensem.ErrInvalidRecord) {
			t.Errorf("%s: DecodeRecord: %v; want ErrInvalidRecord", what, err)
		}
	}
	if _, err := adaptive.DecodeRecord(must(adaptive.EncodeRecord(ok))); err != nil {
		t.Errorf("a good record: %v", err)
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

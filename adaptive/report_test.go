package adaptive_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/adaptive"
)

// TestReportRoundTrip: a report decodes as it was encoded.
func TestReportRoundTrip(t *testing.T) {
	r := adaptive.Report{From: "host-1/4242", Sample: adaptive.Sample{Limit: 12, Busy: 6.75, RTT: 35 * time.Millisecond, Holds: 400, Drops: 3}}
	got, err := adaptive.DecodeReport(adaptive.EncodeReport(r))
	if err != nil || got != r {
		t.Fatalf("decoded %+v, %v; want %+v", got, err, r)
	}
}

// TestReportRefusals: what is not a report a process could send is
// refused with ErrInvalidRecord, unread past MaxReportLen: a forged or
// broken report must neither move the limit far nor cost memory.
func TestReportRefusals(t *testing.T) {
	for _, tc := range []struct {
		name string
		body []byte
	}{
		{"huge", bytes.Repeat([]byte("x"), 1<<20)},
		{"just too long", []byte(`{"from":"` + strings.Repeat("a", adaptive.MaxReportLen) + `"}`)},
		{"not JSON", []byte("holds=5")},
		{"no sender", []byte(`{"limit":3,"holds":5}`)},
		{"long sender", []byte(`{"from":"` + strings.Repeat("a", 200) + `","holds":5}`)},
		{"negative holds", []byte(`{"from":"p","holds":-1}`)},
		{"more drops than holds", []byte(`{"from":"p","holds":2,"drops":3}`)},
		{"limit past MaxPermits", []byte(`{"from":"p","limit":2000000000}`)},
		{"busy past MaxPermits", []byte(`{"from":"p","busy":2000000000}`)},
		{"negative busy", []byte(`{"from":"p","busy":-0.5}`)},
		{"negative latency", []byte(`{"from":"p","holds":1,"rtt_us":-5}`)},
		{"latency of days", []byte(`{"from":"p","holds":1,"rtt_us":400000000000}`)},
		{"holds of 2^40", []byte(`{"from":"p","holds":1099511627776}`)},
	} {
		if r, err := adaptive.DecodeReport(tc.body); !errors.Is(err, tokensem.ErrInvalidRecord) {
			t.Errorf("%s: %+v, %v; want ErrInvalidRecord", tc.name, r, err)
		} else if len(err.Error()) > 300 {
			t.Errorf("%s: a %d-byte error echoes the report", tc.name, len(err.Error()))
		}
	}
}

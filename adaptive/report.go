package adaptive

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/tokensem/tokensem"
)

// MaxReportLen bounds an encoded Report: a longer one is refused unread.
const MaxReportLen = 1024

// Bounds of a report's fields: a report beyond them is refused (a forged or
// broken one must not move the limit far, nor cost the controller memory).
const (
	maxFromLen = 128
	maxHolds   = 1 << 30
	maxRTT     = time.Hour
)

// wireReport is a Report as it travels.
type wireReport struct {
	From     string `json:"from"`
	Limit    int    `json:"limit"`
	InFlight int    `json:"in_flight"`
	RTTMicro int64  `json:"rtt_us"`
	Holds    int    `json:"holds"`
	Drops    int    `json:"drops"`
}

// EncodeReport returns r as a backend's report channel carries it.
func EncodeReport(r Report) []byte {
	b, _ := json.Marshal(wireReport{From: r.From, Limit: r.Sample.Limit, InFlight: r.Sample.InFlight,
		RTTMicro: r.Sample.RTT.Microseconds(), Holds: r.Sample.Holds, Drops: r.Sample.Drops})
	return b
}

// DecodeReport parses a report a backend's channel carried. Errors wrap
// tokensem.ErrInvalidRecord: too long, malformed, or a field out of
// bounds.
func DecodeReport(b []byte) (Report, error) {
	if len(b) > MaxReportLen {
		return Report{}, fmt.Errorf("%w: an adaptive report of %d bytes (at most %d)", tokensem.ErrInvalidRecord, len(b), MaxReportLen)
	}
	var w wireReport
	if err := json.Unmarshal(b, &w); err != nil {
		return Report{}, fmt.Errorf("%w: an adaptive report: %w", tokensem.ErrInvalidRecord, err)
	}
	rtt := time.Duration(w.RTTMicro) * time.Microsecond
	switch {
	case w.From == "" || len(w.From) > maxFromLen:
		return Report{}, fmt.Errorf("%w: an adaptive report from %q", tokensem.ErrInvalidRecord, w.From[:min(len(w.From), 32)])
	case w.Limit < 0 || w.Limit > tokensem.MaxPermits, w.InFlight < 0 || w.InFlight > tokensem.MaxPermits,
		w.Holds < 0 || w.Holds > maxHolds, w.Drops < 0 || w.Drops > w.Holds, rtt < 0 || rtt > maxRTT:
		return Report{}, fmt.Errorf("%w: an adaptive report out of bounds: %+v", tokensem.ErrInvalidRecord, w)
	}
	return Report{From: w.From, Sample: Sample{Limit: w.Limit, InFlight: w.InFlight, RTT: rtt, Holds: w.Holds, Drops: w.Drops}}, nil
}

// Publish sends w's sample as from's report every window until ctx ends,
// through send (a backend's report channel); a window in which this
// process neither held nor ended a hold sends nothing. A failed send is
// dropped (the next window's report follows). It returns ctx.Err().
func Publish(ctx context.Context, w *Window, from string, window time.Duration, send func(Report) error) error {
	if window <= 0 {
		window = time.Second
	}
	tick := time.NewTicker(window)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			s := w.Take()
			if s.Holds == 0 && s.InFlight == 0 {
				continue
			}
			_ = send(Report{From: from, Sample: s})
		}
	}
}

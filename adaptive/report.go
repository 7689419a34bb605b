package adaptive

import (
	"context"
	"encoding/json"
	"errors"
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
	From     string  `json:"from"`
	Limit    int     `json:"limit"`
	Busy     float64 `json:"busy"`
	RTTMicro int64   `json:"rtt_us"`
	Holds    int     `json:"holds"`
	Drops    int     `json:"drops"`
}

// EncodeReport returns r as a backend's report channel carries it.
func EncodeReport(r Report) []byte {
	b, _ := json.Marshal(wireReport{From: r.From, Limit: r.Sample.Limit, Busy: r.Sample.Busy,
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
	case w.Limit < 0 || w.Limit > tokensem.MaxPermits, !(w.Busy >= 0 && w.Busy <= tokensem.MaxPermits),
		w.Holds < 0 || w.Holds > maxHolds, w.Drops < 0 || w.Drops > w.Holds, rtt < 0 || rtt > maxRTT:
		return Report{}, fmt.Errorf("%w: an adaptive report out of bounds: %+v", tokensem.ErrInvalidRecord, w)
	}
	return Report{From: w.From, Sample: Sample{Limit: w.Limit, Busy: w.Busy, RTT: rtt, Holds: w.Holds, Drops: w.Drops}}, nil
}

// Offer decodes body (DecodeReport) and hands the report to out without
// waiting: a full out drops it (a controller reads once a window, and the
// next window's reports follow). It returns the decode error, for the
// caller to log. The backends' report channels call it for each message.
func Offer(out chan<- Report, body []byte) error {
	r, err := DecodeReport(body)
	if err != nil {
		return err
	}
	select {
	case out <- r:
	default:
	}
	return nil
}

// DefaultWindow is the window of Publish and Controller when none is
// given.
const DefaultWindow = time.Second

// Publish sends w's sample as from's report every window (0:
// DefaultWindow) until ctx ends, through send (a backend's PublishReport);
// a window in which this process neither held nor ended a hold sends
// nothing. A send that fails for a reason the next window may not have
// (a broker error) is dropped, and the next window's report follows; one
// refused for good ends Publish. It returns ctx.Err(), an error wrapping
// tokensem.ErrInvalidOption (from empty or longer than 128 bytes, a
// negative window) at once, or the send's tokensem.ErrClosed or
// tokensem.ErrPermissionDenied.
func Publish(ctx context.Context, w *Window, from string, window time.Duration, send func(context.Context, Report) error) error {
	switch {
	case from == "" || len(from) > maxFromLen:
		return fmt.Errorf("%w: a report's sender %q: want 1 to %d bytes", tokensem.ErrInvalidOption, from[:min(len(from), 32)], maxFromLen)
	case window < 0:
		return fmt.Errorf("%w: window %v", tokensem.ErrInvalidOption, window)
	case window == 0:
		window = DefaultWindow
	}
	tick := time.NewTicker(window)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			s := w.Take()
			if s.Holds == 0 && s.Busy == 0 {
				continue
			}
			err := send(ctx, Report{From: from, Sample: s})
			if errors.Is(err, tokensem.ErrClosed) || errors.Is(err, tokensem.ErrPermissionDenied) {
				return err
			}
		}
	}
}

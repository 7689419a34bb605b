package natssem

import (
	"context"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/adaptive"
	"github.com/tokensem/tokensem/internal/ratelog"
)

// reportSubject is the core NATS subject of the semaphore's adaptive
// reports (package adaptive), beside its tokens' subject: no stream stores
// it, so a report no controller hears is gone, and the next window's
// follows.
func (l layout) reportSubject() string { return strings.TrimSuffix(l.subject, ".tokens") + ".reports" }

// PublishReport sends r, this process's adaptive report of one window, to
// the semaphore's controller (adaptive.Controller) over core NATS: one
// small message, no JetStream round trip. It needs publish permission on
// the semaphore's report subject (tokensem.<name>.reports, or
// tokensemg.<group>.<name>.reports in a group).
//
// Errors: tokensem.ErrClosed, ctx.Err(), or a wrapped broker error.
func (s *Semaphore) PublishReport(ctx context.Context, r adaptive.Report) error {
	if s.isClosed() {
		return tokensem.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := s.nc.Publish(s.lay.reportSubject(), adaptive.EncodeReport(r)); err != nil {
		return fmt.Errorf("natssem: publish an adaptive report: %w", wrapBrokerErr(err))
	}
	return nil
}

// reportPendingMsgs bounds the reports a subscription keeps waiting for
// its handler.
const reportPendingMsgs = 1000

// SubscribeReports delivers the semaphore's adaptive reports, those of
// every process of the fleet, on out for a controller, until stop is
// called. A report that does not decode (adaptive.DecodeReport) is dropped
// with a warning; one that finds out full is dropped (the controller
// reads once a window, and the next window's reports follow). It needs
// subscribe permission on the report subject.
//
// Errors: tokensem.ErrClosed, or a wrapped broker error.
func (s *Semaphore) SubscribeReports(ctx context.Context, out chan<- adaptive.Report) (stop func(), err error) {
	if s.isClosed() {
		return nil, tokensem.ErrClosed
	}
	var warn ratelog.Limited // anyone who may publish on the subject can send junk
	sub, err := s.nc.Subscribe(s.lay.reportSubject(), func(m *nats.Msg) {
		if err := adaptive.Offer(out, m.Data); err != nil {
			warn.Warn(s.log, "dropping an adaptive report", "semaphore", s.name, "error", err)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("natssem: subscribe to adaptive reports: %w", wrapBrokerErr(err))
	}
	// A report is at most adaptive.MaxReportLen long, and a fleet sends
	// one per process a window: what waits beyond these bounds is dropped
	// by the client (a slow-consumer error), not kept in memory.
	if err := sub.SetPendingLimits(reportPendingMsgs, reportPendingMsgs*adaptive.MaxReportLen); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("natssem: subscribe to adaptive reports: %w", err)
	}
	fctx, cancel := context.WithTimeout(ctx, s.opts.RequestTimeout)
	defer cancel()
	if err := s.nc.FlushWithContext(fctx); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("natssem: subscribe to adaptive reports: %w", wrapBrokerErr(err))
	}
	return func() { _ = sub.Unsubscribe() }, nil
}

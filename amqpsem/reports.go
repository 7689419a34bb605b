package amqpsem

import (
	"context"
	"errors"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/adaptive"
	"github.com/tokensem/tokensem/internal/ratelog"
)

// reportKey is the routing key of the semaphore's adaptive reports
// (package adaptive) on its exchange: a controller's queue of its own is
// bound with it; no other queue is, so a report no controller hears is
// dropped, and the next window's follows.
func reportKey(name string) string { return "tokensem." + name + ".reports" }

// A controller's report queue keeps at most reportQueueLen reports and
// reportQueueBytes bytes, dropping the oldest (and one larger than that
// at once): a flood of reports, or one huge forged report, costs the
// controller neither broker memory nor its own. The caps bound only the
// messages that wait in the queue: RabbitMQ hands a consumer a message at
// once, whatever its size (3.10.8: a 4 MiB message published to such a
// queue reached its consumer whole; with none, it was dropped at once).
// So the controller takes its reports with basic.get every reportPoll,
// never through a consumer.
const (
	reportQueueLen   = 1000
	reportQueueBytes = 256 << 10
	reportPoll       = 100 * time.Millisecond
)

// PublishReport sends r, this process's adaptive report of one window, to
// the semaphore's controller (adaptive.Controller): one small transient
// message on the semaphore's exchange, routed by reportKey. It needs write
// permission on the exchange (tokensem.<name>.x), as a holder has.
//
// Errors: tokensem.ErrClosed, ctx.Err(), or a wrapped broker error.
func (s *Semaphore) PublishReport(ctx context.Context, r adaptive.Report) error {
	if s.isClosed() {
		return tokensem.ErrClosed
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.RequestTimeout)
	defer cancel()
	ch, _, err := s.c.channel(ctx)
	if err != nil {
		return err
	}
	defer ch.Close()
	err = s.c.rpc(ctx, ch, func() error {
		return ch.PublishWithContext(ctx, exchangeName(s.name), reportKey(s.name), false, false,
			amqp.Publishing{ContentType: "application/json", Body: adaptive.EncodeReport(r)})
	}, nil)
	return wrapBrokerErr("publish an adaptive report", err)
}

// SubscribeReports delivers the semaphore's adaptive reports, those of
// every process of the fleet, on out for a controller, until stop is
// called: through a queue of its own (exclusive, deleted by stop or with
// its connection) bound to the semaphore's exchange, which it empties
// every 100 ms (reportPoll), made again after the connection comes back.
// A report that does not decode (adaptive.DecodeReport) is dropped with a
// (rate-limited) warning; one that finds out full is dropped (the
// controller reads once a window, and the next window's reports follow).
// It needs configure, write and read permission on server-named queues
// (amq.gen-*) and read permission on the exchange.
//
// Errors: tokensem.ErrClosed, ctx.Err() (ctx bounds the first subscribe
// only), or a wrapped broker error.
func (s *Semaphore) SubscribeReports(ctx context.Context, out chan<- adaptive.Report) (stop func(), err error) {
	if s.isClosed() {
		return nil, tokensem.ErrClosed
	}
	sctx, cancel := context.WithCancel(context.Background())
	first := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.consumeReports(sctx, out, first)
	}()
	select {
	case err := <-first:
		if err != nil {
			cancel()
			<-done
			return nil, err
		}
	case <-ctx.Done():
		cancel()
		<-done
		return nil, ctx.Err()
	}
	return func() { cancel(); <-done }, nil
}

// consumeReports hands reports on until ctx ends, taking them again after
// a lost connection, until ctx ends or the Conn is closed; the first
// subscribe's error goes to first.
func (s *Semaphore) consumeReports(ctx context.Context, out chan<- adaptive.Report, first chan<- error) {
	for {
		ch, q, err := s.reportQueue(ctx)
		if first != nil {
			first <- err
			if err != nil {
				return
			}
			first = nil
		}
		switch {
		case err == nil:
			s.pollReports(ctx, ch, q, out)
			s.dropReportQueue(ch, q)
		case errors.Is(err, tokensem.ErrClosed):
			return
		case ctx.Err() == nil:
			s.log.Warn("subscribing to adaptive reports failed; trying again", "semaphore", s.name, "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// reportQueue declares a report queue of this subscriber's own and binds
// it.
func (s *Semaphore) reportQueue(ctx context.Context) (*channel, string, error) {
	ch, _, err := s.c.channel(ctx)
	if err != nil {
		return nil, "", err
	}
	rctx, cancel := s.rtt(ctx)
	defer cancel()
	var q amqp.Queue
	err = s.c.rpc(rctx, ch, func() error {
		dq, err := ch.QueueDeclare("", false, false, true, false, amqp.Table{
			"x-queue-type": "classic", "x-max-length": int64(reportQueueLen), "x-max-length-bytes": int64(reportQueueBytes),
		})
		if err != nil {
			return err
		}
		q = dq
		return ch.QueueBind(q.Name, reportKey(s.name), exchangeName(s.name), false, nil)
	}, nil)
	if err != nil {
		_ = ch.Close()
		return nil, "", wrapBrokerErr("subscribe to adaptive reports", err)
	}
	return ch, q.Name, nil
}

// pollReports takes the reports waiting in queue q every reportPoll and
// hands the decoded ones on, until ctx ends or a take fails (the channel
// or connection closed).
func (s *Semaphore) pollReports(ctx context.Context, ch *channel, q string, out chan<- adaptive.Report) {
	var warn ratelog.Limited // anyone who may publish on the exchange can send junk
	for {
		for {
			var d amqp.Delivery
			var ok bool
			rctx, cancel := s.rtt(ctx)
			err := s.c.rpc(rctx, ch, func() (err error) {
				d, ok, err = ch.Get(q, true)
				return err
			}, nil)
			cancel()
			if err != nil {
				if ctx.Err() == nil {
					s.log.Warn("taking adaptive reports failed; subscribing again", "semaphore", s.name, "error", err)
				}
				return
			}
			if !ok {
				break // none waits
			}
			if err := adaptive.Offer(out, d.Body); err != nil {
				warn.Warn(s.log, "dropping an adaptive report", "semaphore", s.name, "error", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(reportPoll):
		}
	}
}

// dropReportQueue deletes the subscriber's queue, if its channel still
// works (else its connection's end deletes it: it is exclusive), and
// closes the channel.
func (s *Semaphore) dropReportQueue(ch *channel, q string) {
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.RequestTimeout)
	defer cancel()
	_ = s.c.rpc(ctx, ch, func() error {
		_, err := ch.QueueDelete(q, false, false, false)
		return err
	}, nil)
	_ = ch.Close()
}

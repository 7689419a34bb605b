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
// controller neither broker memory nor its own.
const (
	reportQueueLen   = 1000
	reportQueueBytes = 256 << 10
	reportPrefetch   = 64
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
// called: through a queue of its own (exclusive, deleted with its
// channel) bound to the semaphore's exchange, made again after the
// connection comes back. A report that does not decode
// (adaptive.DecodeReport) is dropped with a warning; one that finds out
// full is dropped (the controller reads once a window, and the next
// window's reports follow). It needs configure, write and read permission
// on server-named queues (amq.gen-*) and read permission on the exchange.
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

// consumeReports hands reports on until ctx ends, consuming again after a
// lost connection, until ctx ends or the Conn is closed; the first
// consume's error goes to first.
func (s *Semaphore) consumeReports(ctx context.Context, out chan<- adaptive.Report, first chan<- error) {
	for {
		ch, deliveries, err := s.reportConsumer(ctx)
		if first != nil {
			first <- err
			if err != nil {
				return
			}
			first = nil
		}
		switch {
		case err == nil:
			s.forwardReports(ctx, deliveries, out)
			_ = ch.Close()
		case errors.Is(err, tokensem.ErrClosed):
			return
		case ctx.Err() == nil:
			s.log.Warn("consuming adaptive reports failed; trying again", "semaphore", s.name, "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// reportConsumer declares a report queue of this subscriber's own, binds
// it, and consumes it.
func (s *Semaphore) reportConsumer(ctx context.Context) (*channel, <-chan amqp.Delivery, error) {
	ch, _, err := s.c.channel(ctx)
	if err != nil {
		return nil, nil, err
	}
	rctx, cancel := s.rtt(ctx)
	defer cancel()
	var deliveries <-chan amqp.Delivery
	err = s.c.rpc(rctx, ch, func() error {
		q, err := ch.QueueDeclare("", false, true, true, false, amqp.Table{
			"x-queue-type": "classic", "x-max-length": int64(reportQueueLen), "x-max-length-bytes": int64(reportQueueBytes),
		})
		if err != nil {
			return err
		}
		if err := ch.QueueBind(q.Name, reportKey(s.name), exchangeName(s.name), false, nil); err != nil {
			return err
		}
		// Acknowledged one by one after decoding, at most reportPrefetch
		// ahead: the queue's caps then bound what waits, where an
		// automatic ack would push everything into this client's memory.
		if err := ch.Qos(reportPrefetch, 0, false); err != nil {
			return err
		}
		deliveries, err = ch.Consume(q.Name, "", false, true, false, false, nil)
		return err
	}, nil)
	if err != nil {
		_ = ch.Close()
		return nil, nil, wrapBrokerErr("subscribe to adaptive reports", err)
	}
	return ch, deliveries, nil
}

// forwardReports hands decoded reports on until ctx ends or the
// deliveries stop (the channel or connection closed).
func (s *Semaphore) forwardReports(ctx context.Context, deliveries <-chan amqp.Delivery, out chan<- adaptive.Report) {
	var warn ratelog.Limited // anyone who may publish on the exchange can send junk
	for {
		select {
		case <-ctx.Done():
			return
		case d, ok := <-deliveries:
			if !ok {
				return
			}
			_ = d.Ack(false)
			if err := adaptive.Offer(out, d.Body); err != nil {
				warn.Warn(s.log, "dropping an adaptive report", "semaphore", s.name, "error", err)
			}
		}
	}
}

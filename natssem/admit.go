package natssem

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/driver"
)

// deliver takes a message delivered to a waiting pull along the token's
// path: admit (is it a current token of this semaphore, and of which
// life?), then claim (is its slot free?). A message that is no current
// token is discarded; one that cannot be judged now (a broker error) is
// handed back. It returns what claim returns.
func (s *Semaphore) deliver(ctx context.Context, gaveUp <-chan struct{}, m *nats.Msg) (*Permit, error) {
	meta, err := m.Metadata()
	if err != nil {
		return nil, nil // not a JetStream delivery
	}
	seq := meta.Sequence.Stream
	tok, cfg, err := s.admit(ctx, m.Data)
	if err != nil {
		if errors.Is(err, driver.ErrNotCurrent) {
			s.discard(ctx, m, seq, err)
			return nil, nil
		}
		s.giveBack(m)
		return nil, err
	}
	d := delivery{tok: tok, reply: m.Reply, seq: seq, delivered: meta.NumDelivered}
	return s.claim(ctx, gaveUp, m, d, cfg.Lease)
}

// admit checks a delivered token against the configuration (see
// driver.Admit) and returns it with the configuration it was admitted
// by: that of the token's own life. A token whose epoch or index the cached
// configuration does not know is checked again against one read afresh, so
// a handle that meets a newer life (or a grown count) adopts it first. A
// token that is not a current one of this semaphore is an error wrapping
// driver.ErrNotCurrent.
func (s *Semaphore) admit(ctx context.Context, data []byte) (tokensem.Token, config, error) {
	tok, cfg, err := driver.Admit(
		func() (config, error) { return s.freshConfig(ctx) },
		func() (config, error) { return s.refreshConfig(ctx) },
		func(c config) driver.Entry { return driver.Classify(s.codec, s.name, c.Permits, c.Epoch, data) })
	if err != nil {
		return tokensem.Token{}, config{}, err
	}
	if err := s.opts.checkRequestTimeout(cfg.Lease); err != nil {
		return tokensem.Token{}, config{}, err
	}
	return tok, cfg, nil
}

// discard removes a delivery that can never be a permit (junk, forged, of
// another semaphore, or retired by a resize). Acking removes it from a
// work queue; the delivery is ours, and it holds no slot. A group's stream
// keeps acknowledged messages (see createGroupStream), so there it is
// deleted too.
func (s *Semaphore) discard(ctx context.Context, m *nats.Msg, seq uint64, why error) {
	s.log.Warn("removing an invalid token message", "seq", seq, "reason", why)
	// Acked with a reply (a double ack), so that the message is gone when
	// discard returns: a Status read after the caller's Acquire or
	// TryAcquire does not still count it.
	rctx, cancel := s.rtt(ctx)
	_, err := s.nc.RequestWithContext(rctx, m.Reply, ackAck)
	cancel()
	if err != nil {
		s.log.Warn("could not remove an invalid token message", "seq", seq, "err", err)
	}
	if s.lay.grouped() {
		if err := s.deleteMsg(ctx, seq); err != nil {
			s.log.Warn("could not delete an invalid token message", "seq", seq, "err", err)
		}
	}
}

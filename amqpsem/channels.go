package amqpsem

import (
	"context"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// pooledChannel is a channel set up for waiting and holding (prefetch 1),
// reused across acquires: opening a channel and setting its prefetch cost
// two round trips.
type pooledChannel struct {
	ch     *channel
	sess   *session
	closed chan struct{} // closed when the channel closes
	// claimCancelled hears the broker cancel this channel's slot claim
	// (its claim queue was deleted; see Permit.run).
	claimCancelled chan struct{}
	mu             sync.Mutex
	err            *amqp.Error
}

func (pc *pooledChannel) closeErr() *amqp.Error {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	return pc.err
}

// watch follows the channel until it closes: it records why, and passes on
// the broker's cancellation of the slot claim. amqp091 sends both
// notifications synchronously from its reader (a notification nobody
// takes would stall the connection) and closes both channels when the
// channel closes.
func (pc *pooledChannel) watch(closes chan *amqp.Error, cancels chan string) {
	for {
		select {
		case tag, ok := <-cancels:
			if !ok {
				cancels = nil
				continue
			}
			if tag == claimTag {
				select {
				case pc.claimCancelled <- struct{}{}:
				default:
				}
			}
		case e := <-closes:
			pc.mu.Lock()
			pc.err = e
			pc.mu.Unlock()
			close(pc.closed)
			if cancels != nil {
				for range cancels { // until amqp091 closes it
				}
			}
			return
		}
	}
}

// maxIdleChannels bounds the channels a semaphore keeps for reuse.
const maxIdleChannels = 32

// channel returns an idle channel of the live connection, or opens one.
func (s *Semaphore) channel(ctx context.Context) (*pooledChannel, error) {
	s.mu.Lock()
	for len(s.idle) > 0 {
		pc := s.idle[len(s.idle)-1]
		s.idle = s.idle[:len(s.idle)-1]
		if !pc.ch.IsClosed() && !isDone(pc.sess.lost) {
			s.mu.Unlock()
			return pc, nil
		}
	}
	s.mu.Unlock()
	ch, sess, err := s.c.channel(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.c.rpc(ctx, ch, func() error { return ch.Qos(1, 0, false) }, nil); err != nil {
		s.c.closeLater(ch)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, errRetry{backoff: true}
	}
	pc := &pooledChannel{ch: ch, sess: sess, closed: make(chan struct{}), claimCancelled: make(chan struct{}, 1)}
	go pc.watch(ch.NotifyClose(make(chan *amqp.Error, 1)), ch.NotifyCancel(make(chan string, 1)))
	return pc, nil
}

// putChannel returns an idle channel (no consumer, nothing unacked) to the
// pool, or closes it when the pool is full or the semaphore closed.
func (s *Semaphore) putChannel(pc *pooledChannel) {
	s.mu.Lock()
	if !s.closed && len(s.idle) < maxIdleChannels && !pc.ch.IsClosed() {
		s.idle = append(s.idle, pc)
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	_ = pc.ch.Close()
}

func isDone(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

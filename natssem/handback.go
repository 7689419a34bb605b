package natssem

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// handbacks tracks this client's released tokens until the server confirms
// their Nak. The server queues acks apart from pull requests, so a Nak and a
// later no-wait pull on the same connection are not ordered; TryAcquire
// waits for the confirmations first, so that a token this client released
// is visible to its next TryAcquire. Acquire need not wait: its pull stays
// queued and receives the token whenever the Nak lands. Release itself does
// not wait either, which keeps the release→acquire cycle at three round trips.
type handbacks struct {
	nc     *nats.Conn
	prefix string

	mu      sync.Mutex
	sub     *nats.Subscription
	next    uint64
	pending map[uint64]chan struct{}
	closed  bool
}

func newHandbacks(nc *nats.Conn) *handbacks {
	return &handbacks{nc: nc, prefix: nc.NewInbox() + ".", pending: make(map[uint64]chan struct{})}
}

// nak hands a released token back to the queue, asking for a confirmation.
func (h *handbacks) nak(ackSubject string) error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return h.nc.Publish(ackSubject, ackNak)
	}
	if h.sub == nil {
		sub, err := h.nc.Subscribe(h.prefix+"*", h.confirm)
		if err != nil {
			h.mu.Unlock()
			return h.nc.Publish(ackSubject, ackNak)
		}
		h.sub = sub
	}
	h.next++
	id := h.next
	h.pending[id] = make(chan struct{})
	h.mu.Unlock()
	return h.nc.PublishRequest(ackSubject, h.prefix+strconv.FormatUint(id, 10), ackNak)
}

func (h *handbacks) confirm(m *nats.Msg) {
	id, err := strconv.ParseUint(strings.TrimPrefix(m.Subject, h.prefix), 10, 64)
	if err != nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if ch, ok := h.pending[id]; ok {
		close(ch)
		delete(h.pending, id)
	}
}

// wait blocks until every hand-back issued so far is confirmed, ctx ends, or
// limit passes (a lost confirmation must not block TryAcquire for long).
func (h *handbacks) wait(ctx context.Context, limit time.Duration) {
	h.mu.Lock()
	if len(h.pending) == 0 {
		h.mu.Unlock()
		return
	}
	chs := make([]chan struct{}, 0, len(h.pending))
	for _, ch := range h.pending {
		chs = append(chs, ch)
	}
	h.mu.Unlock()
	t := time.NewTimer(limit)
	defer t.Stop()
	for _, ch := range chs {
		select {
		case <-ch:
		case <-ctx.Done():
			return
		case <-t.C:
			h.drop(chs)
			return
		}
	}
}

// drop forgets confirmations that did not come.
func (h *handbacks) drop(chs []chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for id, ch := range h.pending {
		for _, c := range chs {
			if c == ch {
				delete(h.pending, id)
			}
		}
	}
}

func (h *handbacks) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	if h.sub != nil {
		_ = h.sub.Unsubscribe()
	}
	for id, ch := range h.pending {
		close(ch)
		delete(h.pending, id)
	}
}

// giveBack returns an unclaimed token delivery to the queue. Status
// messages (heartbeats, timeouts) need nothing.
func (s *Semaphore) giveBack(m *nats.Msg) {
	if !isDelivery(m) {
		return
	}
	if err := s.nc.Publish(m.Reply, ackNak); err != nil {
		s.log.Warn("could not give back an unclaimed token; it returns after the lease", "err", err)
	}
}

// handBack gives back a token that reached a waiter whose caller gave up,
// as a release does (see handbacks): the next TryAcquire of this client
// waits until the server has it back.
func (s *Semaphore) handBack(m *nats.Msg) {
	if !isDelivery(m) {
		return
	}
	if err := s.returned.nak(m.Reply); err != nil {
		s.log.Warn("could not give back an unclaimed token; it returns after the lease", "err", err)
	}
}

// holdBack gives a token back to be redelivered after holdBackDelay, not
// at once: a slot being deleted would otherwise bounce between waiters.
func (s *Semaphore) holdBack(m *nats.Msg) {
	if !isDelivery(m) {
		return
	}
	if err := s.nc.Publish(m.Reply, ackNakDelayed); err != nil {
		s.log.Warn("could not give back an unclaimed token; it returns after the lease", "err", err)
	}
}

// holdBackDelay is how long holdBack keeps a token from the waiters.
const holdBackDelay = 100 * time.Millisecond

var (
	ackNakDelayed = []byte(`-NAK {"delay": ` + strconv.FormatInt(int64(holdBackDelay), 10) + `}`)
	ackNak        = []byte("-NAK")
	ackProgress   = []byte("+WPI")
	ackAck        = []byte("+ACK")
)

package natssem

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// A waiter is one Acquire call's place in the consumer's queue of pull
// requests, which the server serves strictly FIFO. It owns an inbox
// subscription; every token delivered to the inbox that the call does not
// claim (it gave up, or a second pull raced the first) is handed straight
// back with a Nak, so an abandoned call never strands a token.
type waiter struct {
	s     *Semaphore
	inbox string
	sub   *nats.Subscription
	ch    chan *nats.Msg
	// reconnected hears the connection come back after a loss: the server
	// (restarted, or another node) knows nothing of the pull pending then.
	reconnected chan nats.Status

	// pulls counts pull requests that may still be pending at the server:
	// each pull adds one; a delivery, 404, 408 or 409 ends one. A waiter
	// with none pending can be reused as is (no unsubscribe, no flush);
	// one that gives up with a pull pending is drained.
	pulls int

	mu        sync.Mutex
	abandoned bool
}

// maxIdleWaiters bounds the inboxes a semaphore keeps for reuse.
const maxIdleWaiters = 64

var noWaitPull = mustMarshal(pullRequest{Batch: 1, NoWait: true})

func mustMarshal(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

type pullRequest struct {
	Batch     int           `json:"batch"`
	Expires   time.Duration `json:"expires,omitempty"`
	Heartbeat time.Duration `json:"idle_heartbeat,omitempty"`
	NoWait    bool          `json:"no_wait,omitempty"`
}

// getWaiter reuses an idle inbox or subscribes a new one.
func (s *Semaphore) getWaiter() (*waiter, error) {
	s.mu.Lock()
	if n := len(s.idle); n > 0 {
		w := s.idle[n-1]
		s.idle = s.idle[:n-1]
		s.mu.Unlock()
		w.mu.Lock()
		w.abandoned = false
		w.mu.Unlock()
		for len(w.reconnected) > 0 { // reconnections while it was idle
			<-w.reconnected
		}
		return w, nil
	}
	s.mu.Unlock()
	w := &waiter{s: s, inbox: s.nc.NewInbox(), ch: make(chan *nats.Msg, 8)}
	sub, err := s.nc.Subscribe(w.inbox, w.deliver)
	if err != nil {
		return nil, wrapBrokerErr(err)
	}
	w.sub = sub
	w.reconnected = s.nc.StatusChanged(nats.CONNECTED)
	return w, nil
}

// close unsubscribes the waiter's inbox at once.
func (w *waiter) close() {
	_ = w.sub.Unsubscribe()
	w.s.nc.RemoveStatusListener(w.reconnected)
}

// deliver runs on the connection's dispatcher for every inbox message.
func (w *waiter) deliver(m *nats.Msg) {
	w.mu.Lock()
	if !w.abandoned {
		select {
		case w.ch <- m:
			w.mu.Unlock()
			return
		default:
		}
	}
	w.mu.Unlock()
	w.s.giveBack(m)
}

// pull asks the server for one token. A waiting pull expires after the pull
// expiry and is kept alive by idle heartbeats; a no-wait pull is answered at
// once with a token or a 404.
func (w *waiter) pull(noWait bool) error {
	b := w.s.waitPull
	if noWait {
		b = noWaitPull
	}
	if err := w.s.nc.PublishRequest(w.s.pullSubj, w.inbox, b); err != nil {
		return wrapBrokerErr(err)
	}
	w.pulls++
	return nil
}

// ended records that the server finished one pull request.
func (w *waiter) ended() {
	if w.pulls > 0 {
		w.pulls--
	}
}

// finish ends the waiter. Tokens it received but did not claim are given
// back. If no pull of it can still be pending at the server, its inbox is
// kept for reuse; otherwise interest in the inbox is drained: the server
// stops serving its pending pulls, and any token already on its way is still
// received and given back.
func (w *waiter) finish() {
	w.mu.Lock()
	w.abandoned = true
	w.mu.Unlock()
	for {
		select {
		case m := <-w.ch:
			w.s.giveBack(m)
			continue
		default:
		}
		break
	}
	s := w.s
	if w.pulls == 0 {
		s.mu.Lock()
		if !s.closed && len(s.idle) < maxIdleWaiters {
			s.idle = append(s.idle, w)
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
	}
	w.s.nc.RemoveStatusListener(w.reconnected)
	if err := w.sub.Drain(); err != nil {
		_ = w.sub.Unsubscribe()
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

func isDelivery(m *nats.Msg) bool { return strings.HasPrefix(m.Reply, "$JS.ACK.") }

// status returns the status code and description of a pull status message
// ("" for a real delivery).
func status(m *nats.Msg) (code, desc string) {
	if len(m.Data) != 0 || m.Header == nil {
		return "", ""
	}
	return m.Header.Get("Status"), m.Header.Get("Description")
}

func isMaxWaiting(desc string) bool {
	return bytes.Contains(bytes.ToLower([]byte(desc)), []byte("maxwaiting"))
}

package natssem

import (
	"bytes"
	"encoding/json"
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

	mu        sync.Mutex
	abandoned bool
}

type pullRequest struct {
	Batch     int           `json:"batch"`
	Expires   time.Duration `json:"expires,omitempty"`
	Heartbeat time.Duration `json:"idle_heartbeat,omitempty"`
	NoWait    bool          `json:"no_wait,omitempty"`
}

func (s *Semaphore) newWaiter() (*waiter, error) {
	w := &waiter{s: s, inbox: s.nc.NewInbox(), ch: make(chan *nats.Msg, 8)}
	sub, err := s.nc.Subscribe(w.inbox, w.deliver)
	if err != nil {
		return nil, wrapBrokerErr(err)
	}
	w.sub = sub
	return w, nil
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
	req := pullRequest{Batch: 1, NoWait: noWait}
	if !noWait {
		req.Expires, req.Heartbeat = w.s.opts.pullExpiry, w.s.opts.heartbeat
	}
	b, _ := json.Marshal(req)
	return wrapBrokerErr(w.s.nc.PublishRequest(w.s.pullSubj, w.inbox, b))
}

// finish ends the waiter. Interest in the inbox is drained: the server stops
// serving this waiter's pending pulls, and any token already on its way is
// still received and given back.
func (w *waiter) finish() {
	w.mu.Lock()
	w.abandoned = true
	w.mu.Unlock()
	for {
		select {
		case m := <-w.ch:
			w.s.giveBack(m)
		default:
			if err := w.sub.Drain(); err != nil {
				_ = w.sub.Unsubscribe()
			}
			return
		}
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

var (
	ackNak      = []byte("-NAK")
	ackProgress = []byte("+WPI")
	ackAck      = []byte("+ACK")
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

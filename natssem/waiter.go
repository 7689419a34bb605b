package natssem

import (
	"bytes"
	"encoding/json"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokensem/tokensem"
)

// A waiter is one Acquire call's place in the consumer's queue of pull
// requests, which the server serves by class, strictly FIFO within one.
// It owns an inbox subscription; every token delivered to the inbox that
// the call does not claim (it gave up, or a second pull raced the first)
// is handed straight back with a Nak, so an abandoned call never strands a
// token.
//
// On a cluster, a call that gives up while its pull is still queued leaves
// the waiter subscribed until that pull ends (a token it hands back, the
// pull's expiry, or the consumer's end), not just until its own node
// forgets it: the consumer's leader may sit on another node, which learns
// of an unsubscribe a moment later and may meanwhile send a token to the
// inbox, where the waiter's node would drop it and the token would wait
// out a whole lease (TestClusterCancelledWaiterStrandsNothing). Such a
// lingering waiter stays among the semaphore's idle ones, and the next
// call of the same Semaphore takes it over, queued pull and all: a caller
// that gives up leaves its place in the queue to the next caller of its
// Semaphore, and a Semaphore whose callers time out and retry keeps one
// pull queued, not one per try. A single server forgets an unsubscribed
// inbox at once, so there the waiter is drained as before.
type waiter struct {
	s     *Semaphore
	inbox string
	sub   *nats.Subscription
	ch    chan *nats.Msg
	// reconnected hears the connection come back after a loss: the server
	// (restarted, or another node) knows nothing of the pull pending then.
	reconnected chan nats.Status

	mu        sync.Mutex
	abandoned bool
	// class is the natsPriority the waiter pulls in: a queued pull keeps the
	// class it was sent with, and only a call of that class adopts it.
	class int
	// pulls counts pull requests that may still be pending at the server:
	// each pull adds one; a delivery, 400, 404, 408, 409 or 503 ends one. A
	// waiter with none pending can be reused as is (no unsubscribe, no
	// flush).
	pulls int
	// sent is when the last pull was sent, heard when the inbox last got a
	// message (a heartbeat included): they tell whether a pull still
	// counted may really be queued (see silence).
	sent, heard time.Time
}

// maxIdleWaiters bounds the inboxes a semaphore keeps for reuse.
const maxIdleWaiters = 64

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
	// Group and Priority place the pull on a consumer that serves pulls
	// by class (see config.PriorityGroup): 0 first, 9 last.
	Group    string `json:"group,omitempty"`
	Priority int    `json:"priority,omitempty"`
}

// natsLevels is how many pull priorities a prioritized consumer orders:
// one per class.
const natsLevels = int(tokensem.HighestPriority-tokensem.LowestPriority) + 1

// natsPriority is the pull priority of class p: the highest class is 0.
func natsPriority(p tokensem.Priority) int { return int(tokensem.HighestPriority - p) }

// pullBodies are the bodies of a Semaphore's pull requests, one of each
// kind per class. Every pull names the consumer's priority group and its
// class, whatever the configuration says the consumer does: one that serves
// pulls by class refuses a pull without the group (400), and one that
// serves them in arrival order ignores both (nats-server 2.10 and 2.11
// too). Both can be met at once: a cluster part-way through an upgrade to
// 2.12 may hold the token consumer with the policy on some servers and
// without it on the older ones, which cannot read it (see upgradeClasses),
// and serves pulls by the policy of whichever is the consumer's leader.
type pullBodies struct {
	wait, noWait [natsLevels][]byte
}

func newPullBodies(expires, heartbeat time.Duration) *pullBodies {
	b := &pullBodies{}
	for c := range natsLevels {
		b.wait[c] = mustMarshal(pullRequest{Batch: 1, Expires: expires, Heartbeat: heartbeat, Group: priorityGroup, Priority: c})
		b.noWait[c] = mustMarshal(pullRequest{Batch: 1, NoWait: true, Group: priorityGroup, Priority: c})
	}
	return b
}

// body returns the body of a pull of class c (a natsPriority).
func (b *pullBodies) body(c int, noWait bool) []byte {
	if noWait {
		return b.noWait[c]
	}
	return b.wait[c]
}

// getWaiter reuses an idle waiter (see idleWaiter), or subscribes a new
// inbox, for a call of class c (a natsPriority). Only a call that waits
// (adopt) takes over a queued pull.
func (s *Semaphore) getWaiter(adopt bool, c int) (*waiter, error) {
	if w := s.idleWaiter(adopt, c); w != nil {
		return w, nil
	}
	w := &waiter{s: s, inbox: s.nc.NewInbox(), ch: make(chan *nats.Msg, 8), class: c}
	sub, err := s.nc.Subscribe(w.inbox, w.deliver)
	if err != nil {
		return nil, wrapBrokerErr(err)
	}
	w.sub = sub
	w.reconnected = s.nc.StatusChanged(nats.CONNECTED)
	return w, nil
}

// idleWaiter takes an idle waiter and marks it in use for class c: when
// adopt is set, first the one of class c that has lingered longest with a
// pull still queued (the call takes its place), else the most recently
// used one with none. A counted pull that has gone silent (see silence) or
// that a reconnection may have cost is taken as lost: the waiter counts as
// having none (a token that still comes is claimed or handed back).
func (s *Semaphore) idleWaiter(adopt bool, c int) *waiter {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	pick, pickQueued := -1, false
	for i, w := range s.idle {
		w.mu.Lock()
		for len(w.reconnected) > 0 {
			<-w.reconnected
			w.pulls = 0
		}
		if w.pulls > 0 && w.silenceLocked(now, s.opts.heartbeat) <= 0 {
			w.pulls = 0
		}
		queued := w.pulls > 0
		class := w.class
		w.mu.Unlock()
		switch {
		case queued && (!adopt || class != c):
		case queued && !pickQueued:
			pick, pickQueued = i, true
		case !queued && !pickQueued:
			pick = i
		}
	}
	if pick < 0 {
		return nil
	}
	w := s.idle[pick]
	s.idle = append(s.idle[:pick], s.idle[pick+1:]...)
	w.mu.Lock()
	w.abandoned = false
	w.class = c // a waiter with a pull queued has it already
	w.mu.Unlock()
	return w
}

// silenceLocked is how long the waiter's last pull may stay silent before
// it counts as lost, by the rule a waiting call applies (take): the first
// heartbeat is due within 1.5 heartbeat intervals of the pull, and a pull
// heard from goes lost after two intervals of silence. Zero or less: lost.
func (w *waiter) silenceLocked(now time.Time, hb time.Duration) time.Duration {
	if w.heard.After(w.sent) {
		return 2*hb - now.Sub(w.heard)
	}
	return hb + hb/2 - now.Sub(w.sent)
}

// silence is silenceLocked for a waiter in use.
func (w *waiter) silence(hb time.Duration) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.silenceLocked(time.Now(), hb)
}

// lost records that the waiter's counted pulls are presumed lost (silent,
// or a reconnection): the call asks again.
func (w *waiter) lost() {
	w.mu.Lock()
	w.pulls = 0
	w.mu.Unlock()
}

// lingeringLocked counts the idle waiters with a pull still queued; s.mu
// is held.
func (s *Semaphore) lingeringLocked() int {
	n := 0
	for _, w := range s.idle {
		if w.pending() > 0 {
			n++
		}
	}
	return n
}

// maxLingering bounds the idle waiters a Semaphore keeps for their queued
// pulls; a caller that gives up beyond it drains its inbox.
const maxLingering = 16

// pending returns the number of pulls that may still be queued.
func (w *waiter) pending() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pulls
}

// drop drains the waiter's inbox: a token already at its node is still
// received and handed back.
func (w *waiter) drop() {
	w.s.nc.RemoveStatusListener(w.reconnected)
	if err := w.sub.Drain(); err != nil {
		_ = w.sub.Unsubscribe()
	}
}

// deliver runs on the connection's dispatcher for every inbox message. A
// message the call does not take (it gave up) is dealt with here: a token
// goes back, and a message that ends a pull is counted.
func (w *waiter) deliver(m *nats.Msg) {
	w.mu.Lock()
	w.heard = time.Now()
	if !w.abandoned {
		select {
		case w.ch <- m:
			w.mu.Unlock()
			return
		default:
		}
	}
	w.endedLocked(m)
	w.mu.Unlock()
	w.s.handBack(m)
}

// pull asks the server for one token. A waiting pull expires after the pull
// expiry and is kept alive by idle heartbeats; a no-wait pull is answered at
// once with a token or a 404.
func (w *waiter) pull(noWait bool) error {
	b := w.s.pulls.body(w.class, noWait)
	// Counted first: the answer may arrive before PublishRequest returns.
	w.mu.Lock()
	w.pulls++
	w.sent = time.Now()
	w.mu.Unlock()
	if err := w.s.nc.PublishRequest(w.s.pullSubj, w.inbox, b); err != nil {
		w.mu.Lock()
		w.pulls--
		w.mu.Unlock()
		return wrapBrokerErr(err)
	}
	return nil
}

// ended records that m, taken from the waiter's channel, may have ended
// one of its pulls.
func (w *waiter) ended(m *nats.Msg) {
	w.mu.Lock()
	w.endedLocked(m)
	w.mu.Unlock()
}

func (w *waiter) endedLocked(m *nats.Msg) {
	if endsPull(m) && w.pulls > 0 {
		w.pulls--
	}
}

// endsPull reports whether m is the server's last word on a one-token
// pull: the token itself, or a status that ends the pull (refused 400, no
// token 404, expired 408, ended by the server 409, nobody to answer it
// 503).
func endsPull(m *nats.Msg) bool {
	switch code, _ := status(m); code {
	case "":
		return isDelivery(m)
	case "400", "404", "408", "409", "503":
		return true
	}
	return false
}

// finish ends the call's use of the waiter. Tokens it received but did not
// claim are given back. A waiter with no pull queued goes back among the
// idle ones; so does one with a pull queued, on a cluster, while fewer than
// maxLingering do (see waiter). Otherwise its inbox is drained.
func (w *waiter) finish() {
	s := w.s
	w.mu.Lock()
	w.abandoned = true
	w.mu.Unlock()
	for {
		select {
		case m := <-w.ch:
			w.ended(m)
			s.handBack(m)
			continue
		default:
		}
		break
	}
	queued := w.pending() > 0
	clustered := queued && s.nc.ConnectedClusterName() != ""
	var evicted *waiter
	s.mu.Lock()
	wanted := !s.closed && (!queued || clustered && s.lingeringLocked() < maxLingering)
	if wanted && queued && len(s.idle) >= maxIdleWaiters {
		// Room for a waiter whose pull is queued: one with none goes.
		for i, o := range s.idle {
			if o.pending() == 0 {
				evicted = o
				s.idle = append(s.idle[:i], s.idle[i+1:]...)
				break
			}
		}
	}
	keep := wanted && len(s.idle) < maxIdleWaiters
	if keep {
		s.idle = append(s.idle, w)
	}
	s.mu.Unlock()
	if evicted != nil {
		evicted.drop()
	}
	if !keep {
		w.drop()
	}
}

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

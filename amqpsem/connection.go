package amqpsem

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem"
)

// Conn is one shared connection to RabbitMQ for all the semaphores of a
// process. It reconnects with backoff when the connection drops; permits
// held on a dropped connection are reported lost at once (the broker
// requeues their tokens), while callers waiting in Acquire subscribe again
// on the new connection.
//
// A watchdog confirms the connection with a round trip every heartbeat/2.
// When no round trip has succeeded for 1.5 heartbeats since it was sent, it
// closes the socket: RabbitMQ waits at least two heartbeats of silence
// before it requeues a client's tokens (measured: 3s for a 1s heartbeat on
// 3.10.8), so the holders learn of the loss first even when only one
// direction of the link fails.
type Conn struct {
	addrs     []address   // the nodes to connect to
	next      int         // index in addrs of the node connect tries first
	tls       *tls.Config // WithTLS's configuration, or nil
	heartbeat time.Duration
	log       *slog.Logger

	maxWaiters int          // WithMaxConnWaiters
	waiters    atomic.Int64 // callers waiting in Acquire (see Semaphore.enterWait)

	mu      sync.Mutex
	locks   map[string]*sync.Mutex // per semaphore: the lock queue excludes other connections only
	cur     *session
	closed  bool
	changed chan struct{} // closed and replaced whenever cur changes
	done    chan struct{}
	wg      sync.WaitGroup
	calls   sync.WaitGroup // rpc calls under way (see rpc)
}

// session is one live AMQP connection.
type session struct {
	conn    *amqp.Connection
	sock    net.Conn      // the TCP connection
	tls     *tlsConn      // over sock for amqps://, else nil
	lost    chan struct{} // closed when this connection is gone (markLost)
	lostMu  sync.Once
	version string                 // server version, e.g. "3.10.8"
	blocked atomic.Pointer[string] // the broker's reason while it blocks publishing
}

// lossGrace is how long the watchdog waits between telling the holders
// that a silent connection is lost and closing its socket, which lets the
// broker requeue their tokens at once.
const lossGrace = 100 * time.Millisecond

// markLost tells everything on s (permits, waiters) that it is gone.
func (s *session) markLost() { s.lostMu.Do(func() { close(s.lost) }) }

// waitConfirms waits for the publisher confirms of publishes on ch. A wait
// cut short while the broker blocks publishing says so (ErrBlocked); a
// publish the broker refused for the user's permissions is a
// permissionError.
func (c *Conn) waitConfirms(ctx context.Context, ch *channel, pending []*amqp.DeferredConfirmation) error {
	for _, dc := range pending {
		ok, err := dc.WaitContext(ctx)
		if err != nil {
			if reason := c.blockedReason(); reason != "" {
				return fmt.Errorf("%w (%s): waiting for a publisher confirm: %w", ErrBlocked, reason, err)
			}
			return wrapBrokerErr("waiting for a publisher confirm", ch.refused(err))
		}
		if !ok {
			// A channel the broker closed nacks what it had not confirmed,
			// and so does amqp091 for a channel whose connection is lost.
			if err := ch.refused(amqp.ErrClosed); denied(err) {
				return err
			}
			if ch.IsClosed() {
				return wrapBrokerErr("waiting for a publisher confirm", amqp.ErrClosed)
			}
			return errors.New("amqpsem: the broker refused (nacked) a publish")
		}
	}
	return nil
}

// blockedReason returns why the broker blocks publishing on the current
// connection, or "".
func (c *Conn) blockedReason() string {
	c.mu.Lock()
	s := c.cur
	c.mu.Unlock()
	if s == nil {
		return ""
	}
	if r := s.blocked.Load(); r != nil {
		return *r
	}
	return ""
}

// supervise watches one connection at a time and replaces it when it dies.
func (c *Conn) supervise(s *session) {
	defer c.wg.Done()
	for {
		c.watch(s)
		s.markLost()
		_ = s.conn.Close()
		c.mu.Lock()
		closed := c.closed
		c.mu.Unlock()
		if closed {
			return
		}
		c.log.Warn("amqp connection lost; reconnecting")
		next := c.reconnect()
		if next == nil {
			return
		}
		c.mu.Lock()
		c.cur = next
		close(c.changed)
		c.changed = make(chan struct{})
		c.mu.Unlock()
		s = next
	}
}

// watch returns when s is closed, by the broker, the network, Close or the
// watchdog.
func (c *Conn) watch(s *session) {
	closed := s.conn.NotifyClose(make(chan *amqp.Error, 1))
	// The negotiated heartbeat (the URL's heartbeat parameter may ask for
	// another), but never longer than the Conn's: W (holdBound) rests on
	// it.
	hb := s.conn.Config.Heartbeat
	if hb <= 0 || hb > c.heartbeat {
		hb = c.heartbeat
	}
	if hb <= 0 {
		select {
		case <-closed:
		case <-c.done:
		}
		return
	}
	probe, err := s.conn.Channel()
	if err != nil {
		return
	}
	tick := time.NewTicker(hb / 2)
	defer tick.Stop()
	lastOK := time.Now()
	for {
		select {
		case <-closed:
			return
		case <-c.done:
			return
		case <-tick.C:
			sent := time.Now()
			ok := make(chan error, 1)
			go func() { ok <- probe.ExchangeDeclarePassive("amq.direct", "direct", true, false, false, false, nil) }()
			deadline := time.NewTimer(time.Until(lastOK.Add(hb + hb/2)))
			select {
			case err := <-ok:
				deadline.Stop()
				if err != nil {
					return
				}
				lastOK = sent
			case <-deadline.C:
				attrs := []any{"heartbeat", hb}
				if r := s.blocked.Load(); r != nil {
					// A blocked connection that published is not read by
					// the broker until the alarm clears.
					attrs = append(attrs, "blocked", *r)
				}
				c.log.Warn("amqp connection silent for 1.5 heartbeats; dropping it", attrs...)
				// Holders first: the broker still counts this connection
				// alive (it waits about two heartbeats), so no token of
				// ours goes to anyone else until the socket closes.
				s.markLost()
				select {
				case <-time.After(lossGrace):
				case <-c.done:
				}
				_ = s.sock.Close()
				<-ok
				return
			case <-closed:
				deadline.Stop()
				return
			}
		}
	}
}

func (c *Conn) reconnect() *session {
	backoff := 100 * time.Millisecond
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		s, err := c.connect(ctx)
		cancel()
		if err == nil {
			c.log.Info("amqp connection restored")
			c.mu.Lock()
			if c.closed {
				c.mu.Unlock()
				_ = s.conn.Close()
				return nil
			}
			c.mu.Unlock()
			return s
		}
		c.log.Warn("amqp reconnect failed", "err", err, "retry_in", backoff)
		select {
		case <-c.done:
			return nil
		case <-time.After(backoff + rand.N(backoff/2)):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// session returns the live connection, waiting (bounded by ctx) while a
// reconnection is under way.
func (c *Conn) session(ctx context.Context) (*session, error) {
	for {
		c.mu.Lock()
		s, closed, changed := c.cur, c.closed, c.changed
		c.mu.Unlock()
		if closed {
			return nil, tokensem.ErrClosed
		}
		select {
		case <-s.lost:
		default:
			return s, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, fmt.Errorf("amqpsem: waiting for the connection to come back: %w", ctx.Err())
		case <-c.done:
			return nil, tokensem.ErrClosed
		}
	}
}

// channel opens a channel on the live connection. A connection that has
// just died may still look current until its supervisor notices: opening a
// channel on it waits for the next connection instead of failing. With a
// context pinned to a session (see pin), it opens the channel on that
// session, or fails with errLockLost once that session is lost.
func (c *Conn) channel(ctx context.Context) (*channel, *session, error) {
	if s := pinnedSession(ctx); s != nil {
		if isDone(s.lost) {
			return nil, nil, errLockLost
		}
		ch, err := c.openChannel(ctx, s)
		switch {
		case err == nil:
			return newChannel(ch), s, nil
		case ctx.Err() != nil:
			return nil, nil, fmt.Errorf("amqpsem: opening a channel: %w", ctx.Err())
		case s.conn.IsClosed() || errors.Is(err, amqp.ErrClosed):
			return nil, nil, errLockLost
		}
		return nil, nil, wrapBrokerErr("open channel", err)
	}
	for {
		s, err := c.session(ctx)
		if err != nil {
			return nil, nil, err
		}
		ch, err := c.openChannel(ctx, s)
		if err == nil {
			return newChannel(ch), s, nil
		}
		if ctx.Err() != nil {
			return nil, nil, fmt.Errorf("amqpsem: opening a channel: %w", ctx.Err())
		}
		if !s.conn.IsClosed() && !errors.Is(err, amqp.ErrClosed) {
			return nil, nil, wrapBrokerErr("open channel", err)
		}
		select {
		case <-s.lost:
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("amqpsem: waiting for the connection to come back: %w", ctx.Err())
		case <-c.done:
			return nil, nil, tokensem.ErrClosed
		}
	}
}

// openChannel opens a channel on s, giving up when ctx ends: amqp091 waits
// for the broker's channel.open-ok with no deadline, so the open goes on in
// the background, and a channel it opens after all is closed there too.
func (c *Conn) openChannel(ctx context.Context, s *session) (*amqp.Channel, error) {
	if ctx.Done() == nil {
		return s.conn.Channel()
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ch, err, done := detach(ctx, c, s.conn.Channel, func(ch *amqp.Channel, _ error) {
		if ch != nil {
			_ = ch.Close() // its caller gave up
		}
	})
	switch {
	case !done:
		return nil, ctx.Err()
	case err == nil && ctx.Err() != nil: // opened as ctx ended
		c.closeLater(&channel{Channel: ch})
		return nil, ctx.Err()
	}
	return ch, err
}

// errLockLost fails work done under a lock (see Semaphore.takeLock) once
// the connection that held the lock is gone: the broker deleted the lock
// queue with it, and another client may hold the lock now.
var errLockLost error = &unavailable{"amqpsem: the connection holding the lock was lost; the locked work stops"}

type pinKey struct{}

// pin returns ctx bound to session s: Conn.channel opens every channel for
// it on s, and fails with errLockLost once s is lost.
func pin(ctx context.Context, s *session) context.Context {
	return context.WithValue(ctx, pinKey{}, s)
}

// pinnedSession returns the session ctx is pinned to, or nil.
func pinnedSession(ctx context.Context) *session {
	s, _ := ctx.Value(pinKey{}).(*session)
	return s
}

// holdBound returns W for holders on c: the longest a holder whose
// connection stopped working still believes it holds. The watchdog (see
// watch) tells them 1.5 watchdog heartbeats after the send time of its
// last confirmed probe.
func (c *Conn) holdBound() time.Duration { return holdBoundOf(c.heartbeat) }

func holdBoundOf(heartbeat time.Duration) time.Duration { return heartbeat + heartbeat/2 }

// heartbeatFor returns the longest whole-second heartbeat whose hold bound
// is at most bound.
func heartbeatFor(bound time.Duration) time.Duration {
	return max(time.Second, (bound * 2 / 3).Truncate(time.Second))
}

// confirmChannel opens a channel in publisher-confirm mode.
func (c *Conn) confirmChannel(ctx context.Context) (*channel, error) {
	ch, _, err := c.channel(ctx)
	if err != nil {
		return nil, err
	}
	if err := c.rpc(ctx, ch, func() error { return ch.Confirm(false) }, nil); err != nil {
		_ = ch.Close()
		return nil, wrapBrokerErr("put a channel in confirm mode", err)
	}
	return ch, nil
}

// localLock returns the in-process lock of lock queue name (see
// Semaphore.takeLock): the broker's exclusive queue keeps other
// connections out, not other callers on this one.
func (c *Conn) localLock(name string) *sync.Mutex {
	c.mu.Lock()
	defer c.mu.Unlock()
	m, ok := c.locks[name]
	if !ok {
		m = new(sync.Mutex)
		c.locks[name] = m
	}
	return m
}

// ServerVersion returns the broker's version as it announced it.
func (c *Conn) ServerVersion() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur.version
}

// Close closes the connection and stops reconnecting. Permits held on it
// are lost (the broker requeues their tokens). Idempotent.
func (c *Conn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	close(c.done)
	s := c.cur
	c.mu.Unlock()
	err := s.conn.Close()
	c.wg.Wait()
	c.calls.Wait() // their calls return now the connection is closed
	if errors.Is(err, amqp.ErrClosed) {
		err = nil
	}
	return err
}

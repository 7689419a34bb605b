package faultproxy

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy forwards TCP connections accepted on a loopback port to a target.
type Proxy struct {
	target string
	delay  time.Duration // one way, fixed at New; see NewDelayed
	ln     net.Listener
	ctx    context.Context // cancelled by Close to abort in-flight dials
	cancel context.CancelFunc
	wg     sync.WaitGroup // every goroutine started by the proxy

	mu     sync.Mutex
	cond   *sync.Cond // signalled when paused/closed state changes
	paused bool
	closed bool
	conns  map[*pair]struct{}

	closeOnce sync.Once
	closeErr  error
}

// pair is one proxied connection: client side and target side.
type pair struct {
	client, server net.Conn
	closed         bool // guarded by Proxy.mu
}

// New listens on 127.0.0.1:0 and forwards every accepted connection to target (host:port).
func New(target string) (*Proxy, error) { return NewDelayed(target, 0) }

// NewDelayed is New with every byte delivered oneWay after it was read, in
// each direction (a round trip through the proxy takes 2×oneWay more),
// without limiting throughput: a link to a distant broker.
func NewDelayed(target string, oneWay time.Duration) (*Proxy, error) {
	if oneWay < 0 {
		return nil, errors.New("faultproxy: negative delay")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{target: target, delay: oneWay, ln: ln, ctx: ctx, cancel: cancel, conns: make(map[*pair]struct{})}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// Addr returns the "127.0.0.1:PORT" address clients should dial.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Pause stops forwarding bytes in both directions on all current and future
// connections without closing them. Data read while paused is held and
// delivered in order on Resume; EOFs and errors are held likewise.
func (p *Proxy) Pause() {
	p.mu.Lock()
	p.paused = true
	p.mu.Unlock()
}

// Resume restarts forwarding after Pause, delivering held bytes in order.
func (p *Proxy) Resume() {
	p.mu.Lock()
	p.paused = false
	p.mu.Unlock()
	p.cond.Broadcast()
}

// Cut closes every current connection (both sides) abruptly, with a TCP
// reset where possible. New connections are still accepted afterwards.
func (p *Proxy) Cut() {
	p.mu.Lock()
	for c := range p.conns {
		p.closePairLocked(c, true)
	}
	p.mu.Unlock()
	p.cond.Broadcast()
}

// Close stops listening, closes all connections and waits for every
// goroutine started by the proxy to exit. It is idempotent.
func (p *Proxy) Close() error {
	p.closeOnce.Do(func() {
		p.mu.Lock()
		p.closed = true
		p.closeErr = p.ln.Close()
		for c := range p.conns {
			p.closePairLocked(c, false)
		}
		p.mu.Unlock()
		p.cancel()
		p.cond.Broadcast()
		p.wg.Wait()
	})
	return p.closeErr
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return // listener closed by Close
		}
		p.wg.Add(1)
		go p.handle(client)
	}
}

// handle dials the target and pumps bytes both ways until both directions end.
func (p *Proxy) handle(client net.Conn) {
	defer p.wg.Done()
	var d net.Dialer
	server, err := d.DialContext(p.ctx, "tcp", p.target)
	if err != nil {
		client.Close()
		return
	}
	c := &pair{client: client, server: server}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		client.Close()
		server.Close()
		return
	}
	p.conns[c] = struct{}{}
	p.mu.Unlock()

	done := make(chan struct{})
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer close(done)
		p.pipe(c, server, client)
	}()
	p.pipe(c, client, server)
	<-done // both directions finished (possibly via half-closes): release the pair
	p.mu.Lock()
	p.closePairLocked(c, false)
	p.mu.Unlock()
	p.cond.Broadcast()
}

// pipe copies src to dst, honouring Pause and the delay. It returns when
// src ends, the pair is closed, or a write fails.
func (p *Proxy) pipe(c *pair, dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	var line *delayLine
	if p.delay > 0 {
		line = newDelayLine(dst, p.delay)
		defer line.close() // idempotent; delivers what is queued
	}
	for {
		n, err := src.Read(buf)
		// Hold whatever we just got (data, EOF or error) while paused. The
		// single buffer plus kernel socket buffers preserve ordering.
		if !p.waitUnpaused(c) {
			return
		}
		if n > 0 {
			var werr error
			if line != nil {
				werr = line.write(buf[:n])
			} else {
				_, werr = dst.Write(buf[:n])
			}
			if werr != nil {
				p.abort(c)
				return
			}
		}
		if err == nil {
			continue
		}
		if line != nil {
			// The end comes after the data read before it.
			if werr := line.close(); werr != nil {
				p.abort(c)
				return
			}
		}
		if tc, ok := dst.(*net.TCPConn); ok && errors.Is(err, io.EOF) {
			tc.CloseWrite() // propagate the half-close, keep the other direction
		} else {
			p.abort(c)
		}
		return
	}
}

// delayLine writes to dst what it is given, each chunk a fixed delay after
// it was given, in order, from a goroutine of its own (ended by close).
type delayLine struct {
	dst    net.Conn
	delay  time.Duration
	chunks chan delayed
	done   chan struct{} // closed when the writer has ended
	failed atomic.Bool   // a write failed: later chunks are dropped
	err    error         // the failed write's error; read after done
	once   sync.Once
}

type delayed struct {
	b   []byte
	due time.Time
}

func newDelayLine(dst net.Conn, delay time.Duration) *delayLine {
	l := &delayLine{dst: dst, delay: delay, chunks: make(chan delayed, 256), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		for c := range l.chunks {
			if l.failed.Load() {
				continue // drain until close
			}
			time.Sleep(time.Until(c.due))
			if _, err := l.dst.Write(c.b); err != nil {
				l.err = err
				l.failed.Store(true)
			}
		}
	}()
	return l
}

var errLineFailed = errors.New("faultproxy: delayed write failed")

// write queues a copy of b. It fails once an earlier write has.
func (l *delayLine) write(b []byte) error {
	if l.failed.Load() {
		return errLineFailed
	}
	l.chunks <- delayed{append([]byte(nil), b...), time.Now().Add(l.delay)}
	return nil
}

// close delivers what is queued, ends the writer and returns the error of
// a write that failed.
func (l *delayLine) close() error {
	l.once.Do(func() { close(l.chunks) })
	<-l.done
	return l.err
}

// waitUnpaused blocks while the proxy is paused. It reports false if the
// pair or proxy was closed in the meantime.
func (p *Proxy) waitUnpaused(c *pair) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.paused && !c.closed && !p.closed {
		p.cond.Wait()
	}
	return !c.closed && !p.closed
}

// abort closes both sides of c and wakes its other pipe if it is paused.
func (p *Proxy) abort(c *pair) {
	p.mu.Lock()
	p.closePairLocked(c, false)
	p.mu.Unlock()
	p.cond.Broadcast()
}

// closePairLocked closes both sides of c once; with reset it sends a TCP RST.
// p.mu must be held; callers broadcast p.cond afterwards.
func (p *Proxy) closePairLocked(c *pair, reset bool) {
	if c.closed {
		return
	}
	c.closed = true
	delete(p.conns, c)
	for _, nc := range []net.Conn{c.client, c.server} {
		if tc, ok := nc.(*net.TCPConn); ok && reset {
			tc.SetLinger(0)
		}
		nc.Close()
	}
}

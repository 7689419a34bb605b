package faultproxy

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
)

// Proxy forwards TCP connections accepted on a loopback port to a target.
type Proxy struct {
	target string
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
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{target: target, ln: ln, ctx: ctx, cancel: cancel, conns: make(map[*pair]struct{})}
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

// pipe copies src to dst, honouring Pause. It returns when src ends, the
// pair is closed, or a write fails.
func (p *Proxy) pipe(c *pair, dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		// Hold whatever we just got (data, EOF or error) while paused. The
		// single buffer plus kernel socket buffers preserve ordering.
		if !p.waitUnpaused(c) {
			return
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				p.abort(c)
				return
			}
		}
		if err == nil {
			continue
		}
		if tc, ok := dst.(*net.TCPConn); ok && errors.Is(err, io.EOF) {
			tc.CloseWrite() // propagate the half-close, keep the other direction
		} else {
			p.abort(c)
		}
		return
	}
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

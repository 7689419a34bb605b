package testcerts

import (
	"crypto/tls"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy terminates TLS on a loopback port and forwards the plaintext bytes
// to a target, so that a plaintext broker can be tested as a TLS one.
type Proxy struct {
	Addr string // host:port of the TLS listener

	ln     net.Listener
	target string

	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	closed  bool
	hsErrs  []error // failed TLS handshakes, oldest first
	wg      sync.WaitGroup
	timeout time.Duration
}

// StartProxy listens on 127.0.0.1 with cfg and forwards each connection
// whose TLS handshake succeeds to target. A t.Cleanup closes the listener
// and every connection and waits for its goroutines.
func StartProxy(t testing.TB, cfg *tls.Config, target string) *Proxy {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatalf("testcerts: proxy listen: %v", err)
	}
	p := &Proxy{Addr: ln.Addr().String(), ln: ln, target: target,
		conns: make(map[net.Conn]struct{}), timeout: 10 * time.Second}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// HandshakeErrors returns the errors of the TLS handshakes that failed so
// far, as the proxy (the server side) saw them.
func (p *Proxy) HandshakeErrors() []error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]error(nil), p.hsErrs...)
}

// Close stops the proxy and cuts every connection through it. Idempotent.
func (p *Proxy) Close() {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		_ = p.ln.Close()
		for c := range p.conns {
			_ = c.Close()
		}
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// track registers c to be closed by Close; false when the proxy is closed.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			return
		}
		p.wg.Add(1)
		go p.serve(c.(*tls.Conn))
	}
}

func (p *Proxy) serve(c *tls.Conn) {
	defer p.wg.Done()
	defer p.untrack(c)
	_ = c.SetDeadline(time.Now().Add(p.timeout))
	if err := c.Handshake(); err != nil {
		p.mu.Lock()
		p.hsErrs = append(p.hsErrs, err)
		p.mu.Unlock()
		return
	}
	_ = c.SetDeadline(time.Time{})
	up, err := net.DialTimeout("tcp", p.target, p.timeout)
	if err != nil {
		return
	}
	if !p.track(up) {
		return
	}
	defer p.untrack(up)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go pipe(up, c)
	go pipe(c, up)
	<-done // either side ended: end both
	_ = c.Close()
	_ = up.Close()
	<-done
}

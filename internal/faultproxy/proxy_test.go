package faultproxy_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokensem/tokensem/internal/faultproxy"
)

// startEcho starts a TCP echo server on 127.0.0.1:0 and stops it on cleanup.
func startEcho(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns = map[net.Conn]struct{}{}
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns[c] = struct{}{}
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				io.Copy(c, c)
				c.Close()
				mu.Lock()
				delete(conns, c)
				mu.Unlock()
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

func newProxy(t *testing.T, target string) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip writes msg and expects it echoed back.
func roundTrip(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatalf("write: %v", err)
	}
	expect(t, c, msg)
}

// expect reads len(want) bytes (with a generous deadline) and compares.
func expect(t *testing.T, c net.Conn, want string) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	defer c.SetReadDeadline(time.Time{})
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("read: %v", err)
	}
	if !bytes.Equal(got, []byte(want)) {
		t.Fatalf("got %q, want %q", got, want)
	}
}

// expectNothing asserts no byte arrives within a short window.
func expectNothing(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	defer c.SetReadDeadline(time.Time{})
	var b [1]byte
	n, err := c.Read(b[:])
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("expected read timeout while paused, got n=%d err=%v", n, err)
	}
}

func TestRoundTrip(t *testing.T) {
	p := newProxy(t, startEcho(t))
	c := dial(t, p.Addr())
	roundTrip(t, c, "hello")
	big := bytes.Repeat([]byte("0123456789"), 50_000) // larger than any buffer
	go c.Write(big)
	expect(t, c, string(big))
}

func TestPauseResume(t *testing.T) {
	p := newProxy(t, startEcho(t))
	c := dial(t, p.Addr())
	roundTrip(t, c, "before")

	p.Pause()
	for _, s := range []string{"abc", "def", "ghi"} {
		if _, err := c.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	// A connection opened while paused is accepted but its bytes are held too.
	c2 := dial(t, p.Addr())
	if _, err := c2.Write([]byte("new")); err != nil {
		t.Fatal(err)
	}
	expectNothing(t, c)
	expectNothing(t, c2)

	p.Resume()
	expect(t, c, "abcdefghi")
	expect(t, c2, "new")
	roundTrip(t, c, "after")
}

func TestCut(t *testing.T) {
	p := newProxy(t, startEcho(t))
	c := dial(t, p.Addr())
	roundTrip(t, c, "ping")

	p.Cut()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var b [16]byte
	_, err := c.Read(b[:])
	if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("expected EOF or reset after Cut, got %v", err)
	}

	c2 := dial(t, p.Addr())
	roundTrip(t, c2, "still works")
}

func TestCutWhilePaused(t *testing.T) {
	p := newProxy(t, startEcho(t))
	c := dial(t, p.Addr())
	roundTrip(t, c, "x")
	p.Pause()
	c.Write([]byte("held"))
	p.Cut()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var b [16]byte
	if _, err := c.Read(b[:]); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("expected EOF or reset after Cut, got %v", err)
	}
	p.Resume()
	roundTrip(t, dial(t, p.Addr()), "ok")
}

func TestCloseNoLeak(t *testing.T) {
	target := startEcho(t)
	before := runtime.NumGoroutine()

	p, err := faultproxy.New(target)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		roundTrip(t, dial(t, p.Addr()), "x")
	}
	p.Pause()
	dial(t, p.Addr()).Write([]byte("held")) // a goroutine blocked on pause

	done := make(chan error, 1)
	go func() { done <- p.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return")
	}
	if err := p.Close(); err != nil { // idempotent
		t.Fatalf("second Close: %v", err)
	}

	const slack = 2
	deadline := time.Now().Add(5 * time.Second)
	for {
		n := runtime.NumGoroutine()
		if n <= before+slack {
			break
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("goroutines: before=%d after=%d\n%s", before, n, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestDelayed: through a delaying proxy every round trip takes at least
// twice the one-way delay, bytes arrive in order, and a half-close still
// reaches the other side after the data before it.
func TestDelayed(t *testing.T) {
	const oneWay = 10 * time.Millisecond
	p, err := faultproxy.NewDelayed(startEcho(t), oneWay)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	c := dial(t, p.Addr())
	for i := range 5 {
		start := time.Now()
		roundTrip(t, c, fmt.Sprintf("message %d;", i))
		if d := time.Since(start); d < 2*oneWay {
			t.Fatalf("round trip %d took %v, less than twice the one-way delay %v", i, d, oneWay)
		}
	}
	// Pipelined writes come back whole and in order.
	var want strings.Builder
	for i := range 50 {
		msg := fmt.Sprintf("<%d>", i)
		want.WriteString(msg)
		if _, err := c.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
	}
	expect(t, c, want.String())
	if _, err := faultproxy.NewDelayed(startEcho(t), -time.Second); err == nil {
		t.Error("NewDelayed with a negative delay: no error")
	}
}

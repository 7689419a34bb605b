package amqpsem

import (
	"errors"
	"testing"
	"time"

	"github.com/tokensem/tokensem/internal/faultproxy"
	"github.com/tokensem/tokensem/internal/rabbittest"
)

// TestLockReleaseHasADeadline: releasing the creation lock deletes its
// exclusive queue; a broker that does not answer that delete must not hold
// the caller past the request timeout (an Init of the bench harness once
// waited 18 minutes on it). The broker is silenced by pausing a proxy
// between it and the client.
func TestLockReleaseHasADeadline(t *testing.T) {
	b := rabbittest.Need(t)
	px, err := faultproxy.New(b.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	ctx := t.Context()
	c, err := Dial(ctx, b.URLVia(px.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const timeout = 500 * time.Millisecond
	name := "lock-deadline-" + time.Now().Format("150405_000000")
	s, err := Init(ctx, c, name, 1, WithRequestTimeout(timeout))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if fc, err := Dial(ctx, b.URL); err == nil {
			_ = ForceDelete(ctx, fc, name)
			_ = fc.Close()
		}
	}()
	defer s.Close()
	_, unlock, err := s.lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	px.Pause()
	done := make(chan struct{})
	start := time.Now()
	go func() { unlock(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout + 5*time.Second):
		px.Resume()
		<-done
		t.Fatalf("releasing the lock waited for a silent broker for %v", time.Since(start).Round(time.Millisecond))
	}
	px.Resume()
	// The lock can be taken again on the same connection once the broker
	// answers.
	_, unlock, err = s.lock(ctx)
	if err != nil {
		t.Fatalf("lock after the broker came back: %v", err)
	}
	unlock()
}

// TestLockedWriteStopsWithItsConnection: a configuration write (what a
// Resize does under the lock) after the lock's connection was lost fails,
// even though the Conn has reconnected meanwhile: the lock went with the
// old connection.
func TestLockedWriteStopsWithItsConnection(t *testing.T) {
	b := rabbittest.Need(t)
	px, err := faultproxy.New(b.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	ctx := t.Context()
	c, err := Dial(ctx, b.URLVia(px.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	name := "lock-lost-" + time.Now().Format("150405_000000")
	s, err := Init(ctx, c, name, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if fc, err := Dial(ctx, b.URL); err == nil {
			_ = ForceDelete(ctx, fc, name)
			_ = fc.Close()
		}
	}()
	defer s.Close()
	locked, unlock, err := s.lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	old, err := c.session(ctx)
	if err != nil {
		t.Fatal(err)
	}
	px.Cut()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if cur, err := c.session(ctx); err == nil && cur != old {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the Conn did not reconnect")
		}
	}
	cfg := s.config()
	cfg.Permits, cfg.Seq = 5, cfg.Seq+1
	if err := s.writeConfig(locked, cfg); !errors.Is(err, errLockLost) {
		t.Fatalf("write under a lost lock: %v; want errLockLost", err)
	}
	o, err := Open(ctx, c, name)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if o.Permits() != 1 {
		t.Fatalf("permits %d after a write under a lost lock, want 1", o.Permits())
	}
}

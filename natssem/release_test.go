package natssem

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// logTap is a slog handler that keeps the messages of every record.
type logTap struct {
	mu   sync.Mutex
	msgs []string
}

func (l *logTap) Enabled(context.Context, slog.Level) bool { return true }
func (l *logTap) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.msgs = append(l.msgs, r.Message)
	l.mu.Unlock()
	return nil
}
func (l *logTap) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logTap) WithGroup(string) slog.Handler      { return l }

func (l *logTap) saw(prefix string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.msgs {
		if strings.HasPrefix(m, prefix) {
			return true
		}
	}
	return false
}

// A waiter can read a slot record before its holder's release is visible:
// on a replicated bucket a read may come from a replica that applies the
// free write a little after the quorum did. It must wait for the free
// record, not step away: the token would then stay unused until the server
// redelivers it, a whole lease later. Here the free write is held back on
// purpose, after the Nak.
func TestWaiterAwaitsALateRelease(t *testing.T) {
	srv := startServer(t)
	ctx := testContext(t)
	const lease = 20 * time.Second
	a, err := Init(ctx, dial(t, srv), "late-release", 1, WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	tap := &logTap{}
	b, err := Open(ctx, dial(t, srv), "late-release", WithLogger(slog.New(tap)))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	b.releaseWait = lease / 4 // the held-back write must not outlast the wait

	p, err := a.take(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		p   *Permit
		err error
	}
	got := make(chan result, 1)
	go func() {
		// Well under the lease: only a waiter that waits for the free
		// record gets the token in time.
		wctx, cancel := context.WithTimeout(ctx, lease/2)
		defer cancel()
		pb, err := b.take(wctx, false)
		got <- result{pb, err}
	}()
	for {
		info, err := a.consumerInfo(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.NumWaiting >= 1 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}

	// A release whose free write is not visible yet when its token arrives.
	p.stopRenewals()
	if err := a.nc.Publish(p.d.reply, ackNak); err != nil {
		t.Fatal(err)
	}
	for !tap.saw("token delivered before its release was visible") {
		select {
		case r := <-got:
			t.Fatalf("waiter returned before the release landed: %v", r.err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	if err := p.free(ctx); err != nil {
		t.Fatal(err)
	}

	r := <-got
	if r.err != nil {
		t.Fatalf("waiter did not get the released token: %v", r.err)
	}
	if r.p.Fence() <= p.Fence() {
		t.Fatalf("fence did not grow: %d then %d", p.Fence(), r.p.Fence())
	}
	if err := r.p.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

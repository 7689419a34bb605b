package amqpsem

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem/internal/rabbittest"
)

// TestRPCAbortKeepsConnection: an rpc whose ctx ends while fn's calls are
// under way returns at once, and fn's later calls still get their answers.
// Closing the channel under them (what rpc once did) let the one close-ok
// be taken by fn's next call, which left the Close waiting for ever (a
// chaos worker hung on SIGTERM), or let a method reach the broker after
// the close-ok, which is a connection error (504 "expected
// 'channel.open'") that drops every permit held on the connection.
func TestRPCAbortKeepsConnection(t *testing.T) {
	ctx := t.Context()
	c, setup, sess := dialChannel(t)
	q, err := setup.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	var undone atomic.Int32
	const rounds = 200
	for round := range rounds {
		ch, _, err := c.channel(ctx)
		if err != nil {
			t.Fatalf("round %d: open channel: %v", round, err)
		}
		cctx, cancel := context.WithCancel(ctx)
		var calls int
		fnErr := make(chan error, 1)
		err = c.rpc(cctx, ch, func() error {
			cancel() // the abort begins while the calls go on
			for range 3 {
				if _, err := ch.QueueDeclarePassive(q.Name, false, true, true, false, nil); err != nil {
					fnErr <- err
					return err
				}
				calls++
			}
			fnErr <- nil
			return nil
		}, func() {
			if calls == 3 {
				undone.Add(1)
			}
		})
		if !errors.Is(err, errAborted) && err != nil {
			t.Fatalf("round %d: rpc = %v, want nil or errAborted", round, err)
		}
		closed := make(chan struct{})
		go func() { _ = ch.Close(); close(closed) }()
		select {
		case <-closed:
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: Close of the channel has not returned in 5 s", round)
		}
		select {
		case err := <-fnErr:
			if err != nil {
				t.Fatalf("round %d: a call after the abort failed: %v", round, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: fn's calls have not returned in 5 s", round)
		}
		waitFor(t, func() bool { return ch.IsClosed() }, "round %d: the abandoned channel was never closed", round)
	}
	if isDone(sess.lost) {
		t.Fatal("the connection was lost")
	}
	if _, err := setup.QueueDeclarePassive(q.Name, false, true, true, false, nil); err != nil {
		t.Fatalf("the connection's other channel failed: %v", err)
	}
	if undone.Load() == 0 {
		t.Errorf("no rpc of %d was abandoned (each cancels its ctx before its calls): the test proves nothing", rounds)
	}
	t.Logf("%d of %d rpcs abandoned and undone", undone.Load(), rounds)
}

// TestRPCKeepsResultOfFinishedCall: a call that returned before its ctx
// ended keeps its result, and the channel stays usable.
func TestRPCKeepsResultOfFinishedCall(t *testing.T) {
	ctx := t.Context()
	c, ch, _ := dialChannel(t)
	var q amqp.Queue
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err := c.rpc(cctx, ch, func() (err error) {
		q, err = ch.QueueDeclare("", false, true, true, false, nil)
		return err
	}, func() { t.Error("undo ran for a call that was not abandoned") })
	if err != nil || q.Name == "" {
		t.Fatalf("rpc = %v, queue %q", err, q.Name)
	}
	cancel()
	if err := c.rpc(cctx, ch, func() error { return nil }, nil); !errors.Is(err, errAborted) {
		t.Fatalf("rpc with an ended ctx = %v, want errAborted", err)
	}
	if ch.abandoned.Load() {
		t.Fatal("a call that never started abandoned the channel")
	}
	if _, err := ch.QueueDeclarePassive(q.Name, false, true, true, false, nil); err != nil {
		t.Fatalf("the channel failed after the calls: %v", err)
	}
}

// dialChannel connects to the test broker and opens a channel; both close
// when the test ends.
func dialChannel(t *testing.T) (*Conn, *channel, *session) {
	t.Helper()
	c, err := Dial(t.Context(), rabbittest.Need(t).URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ch, sess, err := c.channel(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ch.Close() })
	return c, ch, sess
}

func waitFor(t *testing.T, ok func() bool, format string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf(format, args...)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

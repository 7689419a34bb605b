package amqpsem

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokensem/tokensem/internal/rabbittest"
	"github.com/tokensem/tokensem/internal/semtest"
)

// TestClusterConfigReadersLostWithTheirNode: readers connected to tsc read
// the configuration (led by tsb) over and over when tsc is killed. The
// message one of them held at that instant must come back: a reader
// through tsb reads it. RabbitMQ 3.10 keeps a message checked out to a
// consumer that was cancelled before its node was lost until the queue's
// leader changes, so a reader that cancelled before returning the message
// left the semaphore without a configuration (see loadConfigOnce). A kill
// found one semaphore's reader in that state about one time in three, so
// the test reads six semaphores, two readers each.
func TestClusterConfigReadersLostWithTheirNode(t *testing.T) {
	t.Parallel() // beside the tests that need no cluster; NeedCluster gives each that does a cluster of its own
	// Per semaphore, a message held by one reader, the other waiting for it.
	const semaphores, readers = 6, 2
	c := rabbittest.NeedCluster(t)
	ctx := semtest.Context(t, 3*time.Minute)
	dial := func(node string) *Conn {
		conn, err := Dial(ctx, c.URL(node))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		return conn
	}
	viaB := dial("tsb")
	conns := []*Conn{dial("tsc"), dial("tsc"), dial("tsc")}
	var wg sync.WaitGroup
	defer wg.Wait()
	rctx, stop := context.WithCancel(ctx)
	defer stop() // before the wait
	var reads atomic.Int64
	var sems []*Semaphore // through tsb
	for i := range semaphores {
		// Marked for testenv.Main's sweep.
		n := fmt.Sprintf("a%s-ConfigReadersLost-%d-%d", semtest.RunID, configReadersRun.Add(1), i)
		s, err := Init(ctx, viaB, n, 2) // the queues' leader is tsb
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		defer func() { _ = ForceDelete(semtest.Context(t, time.Minute), viaB, n) }()
		sems = append(sems, s)
		for r := range readers {
			s, err := Open(ctx, conns[(i*readers+r)%len(conns)], n)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			wg.Go(func() {
				for rctx.Err() == nil {
					if _, err := s.loadConfig(rctx); err == nil {
						reads.Add(1)
					}
				}
			})
		}
	}
	time.Sleep(2 * time.Second)
	if err := c.Kill("tsc"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	stop()
	t.Logf("%d reads through tsc before it was killed", reads.Load())
	// The queue's counts take a moment to drop the lost readers; a read
	// waits for them (configRetry) before it says the message stays held.
	for _, s := range sems {
		for try := 1; ; try++ {
			_, err := s.loadConfig(ctx)
			if err == nil {
				t.Logf("configuration of %s read through tsb %v after tsc died (try %d)", s.name, time.Since(start).Round(time.Millisecond), try)
				break
			}
			if try == 2 {
				out, _ := c.Ctl("tsb", "list_queues", "name", "messages_ready", "messages_unacknowledged", "consumers")
				var mine []string
				for line := range strings.Lines(out) {
					if strings.Contains(line, s.name) {
						mine = append(mine, line)
					}
				}
				t.Errorf("no configuration of %s through tsb %v after tsc died: %v\nits queues (name, ready, unacknowledged, consumers):\n%s",
					s.name, time.Since(start).Round(time.Millisecond), err, strings.Join(mine, ""))
				break
			}
		}
	}
	// Deleting a quorum queue one of whose members is down is slow: the
	// node comes back first.
	restart := time.Now()
	if err := c.Start("tsc"); err != nil {
		t.Fatal(err)
	}
	t.Logf("tsc restarted in %v", time.Since(restart).Round(time.Millisecond))
}

// configReadersRun numbers the runs of TestClusterConfigReadersLostWithTheirNode
// in one process (-count).
var configReadersRun atomic.Int64

package semtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tokensem/tokensem"
)

// testCount: Count follows the permits as they are taken, waited for and
// returned.
func testCount(t *testing.T, b Backend) {
	name := uniqueName(t)
	s := mustInit(t, b, name, 3, Options{})
	counter, ok := s.(tokensem.Counter)
	if !ok {
		t.Skip("the backend cannot count")
	}
	var last tokensem.Count
	expect := func(want tokensem.Count) {
		t.Helper()
		eventually(t, 10*time.Second, "count "+fmtCount(want)+" (last "+fmtCount(last)+")", func() bool {
			c, err := counter.Count(Context(t, 10*time.Second))
			if err != nil {
				t.Fatalf("count: %v", err)
			}
			last = c
			return c == want
		})
	}
	expect(tokensem.Count{Permits: 3, Available: 3})
	ps := []tokensem.Permit{mustAcquire(t, s, 10*time.Second), mustAcquire(t, s, 10*time.Second)}
	expect(tokensem.Count{Permits: 3, Available: 1, Held: 2})
	ps = append(ps, mustAcquire(t, s, 10*time.Second))

	waiter := mustOpen(t, b, b.Addr, name, Options{})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	got := make(chan tokensem.Permit, 1)
	go func() {
		if p, err := waiter.Acquire(ctx); err == nil {
			got <- p
		}
	}()
	expect(tokensem.Count{Permits: 3, Held: 3, Waiting: 1})
	releaseAll(t, ps)
	select {
	case p := <-got:
		mustRelease(t, p)
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter got no permit")
	}
	// A NATS waiter may leave a second pull queued until it expires, which
	// counts as waiting meanwhile (see natssem's Count).
	last.Waiting = 0
	eventually(t, 10*time.Second, "all 3 available again (last "+fmtCount(last)+")", func() bool {
		c, err := counter.Count(Context(t, 10*time.Second))
		if err != nil {
			t.Fatalf("count: %v", err)
		}
		last = c
		return c.Permits == 3 && c.Available == 3 && c.Held == 0
	})
}

func fmtCount(c tokensem.Count) string {
	return fmt.Sprintf("%d permits, %d available, %d held, %d waiting", c.Permits, c.Available, c.Held, c.Waiting)
}

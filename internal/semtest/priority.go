package semtest

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/tokensem/tokensem"
)

// testPriority: waiters of three classes queue on a semaphore of one
// permit, the lowest class first; each release goes to the highest class
// waiting, and within a class to the one that queued first. A class out of
// range is refused and changes nothing. Every broker the suite runs on
// serves classes (nats-server 2.12 and later, RabbitMQ): a backend that
// refused them (ErrPriorityUnsupported) fails here.
func testPriority(t *testing.T, b Backend) {
	name := uniqueName(t)
	s := mustInit(t, b, name, 1, Options{})
	holder := mustAcquire(t, s, 5*time.Second)

	bad := tokensem.WithPriority(Context(t, 5*time.Second), tokensem.HighestPriority+1)
	if _, err := s.Acquire(bad); !errors.Is(err, tokensem.ErrInvalidOption) {
		t.Fatalf("Acquire in class %d: err = %v, want ErrInvalidOption", tokensem.HighestPriority+1, err)
	}

	// Queued in this order; served high, then normal, then low.
	classes := []tokensem.Priority{-2, -2, -2, 0, 0, 3, 3}
	order, reissued := serveQueued(t, b, name, s, holder, classes)
	if len(order) != len(classes) {
		t.Fatalf("served %d of %d waiters", len(order), len(classes))
	}
	want := []int{5, 6, 3, 4, 0, 1, 2}
	if n, why := reissued.count(); n != 0 {
		// A waiter that asked again (a consumer's leader change ends every
		// pull waiting on it) keeps its class but not its place in it.
		t.Logf("%d waiting pulls re-issued during the run (last: %s); service order %v", n, why, order)
		for k := 1; k < len(order); k++ {
			if classes[order[k]] > classes[order[k-1]] {
				t.Fatalf("service order %v (classes %v): class %d served after class %d", order, classes, classes[order[k]], classes[order[k-1]])
			}
		}
		return
	}
	if !slices.Equal(order, want) {
		t.Fatalf("service order %v, want %v (classes %v, queued in index order)", order, want, classes)
	}
}

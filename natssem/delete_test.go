package natssem_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/semtest"
	"github.com/tokensem/tokensem/natssem"
)

// TestForceDeleteCutShort: a ForceDelete whose context ends while it waits
// for the holder's lease puts the semaphore back, and the holder's slot
// stays its (nobody else gets it); a second ForceDelete waits for the
// holder's lease again, so that when it returns the holder has learned of
// its loss and no new semaphore of the name can overlap it.
func TestForceDeleteCutShort(t *testing.T) {
	const name, lease = "force-cut-short", 3 * time.Second
	s := initNATS(t, name, 1, natssem.WithLease(lease))
	p, err := s.Acquire(semtest.Context(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	nc := connect(t, srv.Addr().String())
	short, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if err := natssem.ForceDelete(short, nc, name); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ForceDelete cut short: err = %v, want the deadline", err)
	}
	other, err := natssem.Open(semtest.Context(t, 10*time.Second), connect(t, srv.Addr().String()), name)
	if err != nil {
		t.Fatalf("open after a ForceDelete cut short: %v", err)
	}
	defer other.Close()
	if q, err := other.TryAcquire(semtest.Context(t, 10*time.Second)); !errors.Is(err, tokensem.ErrNoPermit) {
		if err == nil {
			_ = q.Release(t.Context())
		}
		t.Fatalf("TryAcquire while the first holder may still hold: err = %v, want ErrNoPermit", err)
	}

	start := time.Now()
	if err := natssem.ForceDelete(semtest.Context(t, time.Minute), nc, name); err != nil {
		t.Fatalf("second ForceDelete: %v", err)
	}
	select {
	case <-p.Done():
	default:
		t.Fatalf("ForceDelete returned after %v while the holder had not learned of its loss", time.Since(start))
	}
	if !errors.Is(p.Err(), tokensem.ErrLeaseLost) {
		t.Errorf("holder: Err = %v, want ErrLeaseLost", p.Err())
	}
	t.Logf("the second ForceDelete returned after %v (lease %v); the holder learned %v", time.Since(start), lease, p.Err())
}

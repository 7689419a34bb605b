package natssem_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/driver"
	"github.com/tokensem/tokensem/internal/semtest"
	"github.com/tokensem/tokensem/natssem"
)

// TestForceDeleteCutShort: a ForceDelete whose context ends while it waits
// for the holder's lease puts the semaphore back, and the holder's slot
// stays its (nobody else gets it); a second ForceDelete waits for the
// holder's lease again, so that when it returns the holder has learned of
// its loss and no new semaphore of the name can overlap it.
func TestForceDeleteCutShort(t *testing.T) {
	t.Parallel()
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

// TestDeleteWorkBoundedByRealSlots: an unsigned token naming the last slot
// there can be, put in the stream of a 2-permit semaphore, makes Delete
// close that slot and the real ones, not every slot up to it (it wrote
// 901,501 records in 65 s before, and left the semaphore "being deleted").
// The writes to the bucket are counted on the wire.
func TestDeleteWorkBoundedByRealSlots(t *testing.T) {
	const name = "delete-far-slot"
	s := initNATS(t, name, 2)
	far, err := driver.Codec{}.Encode(driver.NewToken(name, tokensem.MaxPermits-1, 1))
	if err != nil {
		t.Fatal(err)
	}
	rawPublish(t, name, far)
	_ = s.Close()
	watch := connect(t, srv.Addr().String())
	var writes atomic.Int64
	sub, err := watch.Subscribe("$KV."+natssem.ResourcesOf(name, "").Bucket+".>", func(*nats.Msg) { writes.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := natssem.Delete(semtest.Context(t, 60*time.Second), connect(t, srv.Addr().String()), name); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	// The configuration's mark, the admin lock's records, the generation,
	// and one closing write per slot: 0, 1 and the far one.
	t.Logf("%d writes to the bucket", writes.Load())
	if n := writes.Load(); n > 20 {
		t.Fatalf("Delete wrote %d records to the bucket of a 2-permit semaphore", n)
	}
	if _, err := natssem.Open(t.Context(), connect(t, srv.Addr().String()), name); !errors.Is(err, tokensem.ErrNotInitialized) {
		t.Fatalf("Open after Delete: %v", err)
	}
}

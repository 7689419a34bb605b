package semtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/reconciler"
)

// resizer is what both backends' semaphores offer beyond tokensem.Semaphore
// to change the number of permits.
type resizer interface {
	Resize(ctx context.Context, permits int) (reconciler.Report, error)
}

// testGrowSeenByStaleClient: a client that read the configuration (2
// permits) just before another grew the semaphore to 3 receives the new
// slot's token while its copy still says 2. It must look again, not throw
// the token away: all 3 permits are usable through it.
func testGrowSeenByStaleClient(t *testing.T, b Backend) {
	name := uniqueName(t)
	admin := mustInit(t, b, name, 2, Options{})
	stale := mustOpen(t, b, b.Addr, name, Options{})
	r, ok := admin.(resizer)
	if !ok {
		t.Skipf("%T cannot resize", admin)
	}
	if _, err := r.Resize(Context(t, 30*time.Second), 3); err != nil {
		t.Fatalf("resize to 3: %v", err)
	}
	ps := drainAll(t, stale, 3)
	defer releaseAll(t, ps)
	if len(ps) != 3 {
		t.Fatalf("a client that read 2 permits before a resize to 3 got %d permits", len(ps))
	}
}

// testConcurrentAdmin: resizes between 3 and 4 permits and reconcile runs,
// from four clients at once. Every run must end healthy (a census must
// never mix the permit count before a resize with the tokens after it, and
// remove a token that had just become valid), and a last resize to 3 must
// leave exactly 3 usable permits.
func testConcurrentAdmin(t *testing.T, b Backend) {
	if b.Inventory == nil {
		t.Skip("the backend offers no inventory")
	}
	name := uniqueName(t)
	mustInit(t, b, name, 3, Options{})
	const rounds = 6
	var wg sync.WaitGroup
	errs := make(chan error, 4*rounds)
	for c := range 4 {
		s := mustOpen(t, b, b.Addr, name, Options{})
		r, ok := s.(resizer)
		if !ok {
			t.Skipf("%T cannot resize", s)
		}
		inv := b.Inventory(s)
		wg.Go(func() {
			for i := range rounds {
				ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
				var (
					rep  reconciler.Report
					err  error
					what string
				)
				if c%2 == 0 {
					n := 3 + (i+c/2)%2
					what = fmt.Sprintf("client %d: resize to %d", c, n)
					rep, err = r.Resize(ctx, n)
				} else {
					what = fmt.Sprintf("client %d: reconcile", c)
					rep, err = reconciler.Run(ctx, inv, true)
				}
				cancel()
				switch {
				case err != nil:
					errs <- fmt.Errorf("%s: %w", what, err)
				case !rep.Healthy:
					errs <- fmt.Errorf("%s: not healthy after the run: %+v", what, rep)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	admin := mustOpen(t, b, b.Addr, name, Options{})
	if _, err := admin.(resizer).Resize(Context(t, time.Minute), 3); err != nil {
		t.Fatalf("last resize to 3: %v", err)
	}
	// Exactly 3 usable: three waits succeed, and then none is free. (A
	// TryAcquire drain right after the resize's last write once found only
	// 2 on NATS: a token the repair just touched may reach the consumer a
	// moment later.)
	var ps []tokensem.Permit
	defer func() { releaseAll(t, ps) }()
	for range 3 {
		ps = append(ps, mustAcquire(t, admin, 10*time.Second))
	}
	if p, err := admin.TryAcquire(Context(t, 10*time.Second)); !errors.Is(err, tokensem.ErrNoPermit) {
		if err == nil {
			ps = append(ps, p)
		}
		t.Fatalf("after resizing to 3 and taking 3 permits: TryAcquire = %v, want ErrNoPermit", err)
	}
	settled(t, admin, "after resizing to 3", func(st tokensem.Status) bool {
		return st.Tokens == 3 && st.Healthy && st.Held == 3
	})
}

// testDelete: Delete refuses while a permit is held and changes nothing;
// ForceDelete removes the semaphore anyway, its holder loses its permit and
// its waiter gives up with ErrNotInitialized; the name is then free for an
// Init with another count; List follows along.
func testDelete(t *testing.T, b Backend) {
	if b.Delete == nil {
		t.Skip("the backend cannot delete")
	}
	name := uniqueName(t)
	s := mustInit(t, b, name, 1, Options{Lease: 2 * time.Second})
	listed := func() (tokensem.Info, bool) {
		t.Helper()
		if b.List == nil {
			return tokensem.Info{}, false
		}
		infos, err := b.List(t)
		if err != nil {
			t.Fatalf("list: %v", err)
		}
		for _, in := range infos {
			if in.Name == name {
				return in, true
			}
		}
		return tokensem.Info{}, false
	}
	if in, ok := listed(); b.List != nil && (!ok || in.Permits != 1 || in.State != "ready") {
		t.Fatalf("list after init: %+v (found %v)", in, ok)
	}

	p := mustAcquire(t, s, 10*time.Second)
	waiterClient := mustOpen(t, b, b.Addr, name, Options{})
	waited := make(chan error, 1)
	go func() {
		_, err := waiterClient.Acquire(Context(t, time.Minute))
		waited <- err
	}()
	time.Sleep(200 * time.Millisecond) // the waiter is queued
	if err := b.Delete(t, name, false); !errors.Is(err, tokensem.ErrHeld) {
		t.Fatalf("delete while a permit is held: err = %v, want ErrHeld", err)
	}
	settled(t, s, "a refused delete changed the semaphore", func(st tokensem.Status) bool {
		return st.Held == 1 && st.Permits == 1
	})

	if err := b.Delete(t, name, true); err != nil {
		t.Fatalf("forced delete: %v", err)
	}
	select {
	case <-p.Done():
		if !errors.Is(p.Err(), tokensem.ErrLeaseLost) {
			t.Errorf("holder after a forced delete: Err = %v, want ErrLeaseLost", p.Err())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the holder did not learn within 10s that its semaphore was deleted")
	}
	select {
	case err := <-waited:
		if !errors.Is(err, tokensem.ErrNotInitialized) {
			t.Errorf("waiter after a forced delete: err = %v, want ErrNotInitialized", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the waiter still waits 20s after its semaphore was deleted")
	}
	if _, err := b.Open(t, b.Addr, name, Options{}); !errors.Is(err, tokensem.ErrNotInitialized) {
		t.Fatalf("open after delete: err = %v, want ErrNotInitialized", err)
	}
	if in, ok := listed(); ok {
		t.Fatalf("list after delete still shows %+v", in)
	}
	if err := b.Delete(t, name, false); !errors.Is(err, tokensem.ErrNotInitialized) {
		t.Fatalf("second delete: err = %v, want ErrNotInitialized", err)
	}

	again := mustInit(t, b, name, 3, Options{})
	settled(t, again, "init after delete with another count", func(st tokensem.Status) bool {
		return st.Permits == 3 && st.Tokens == 3 && st.Healthy
	})
	if err := b.Delete(t, name, false); err != nil {
		t.Fatalf("delete with no holder: %v", err)
	}
}

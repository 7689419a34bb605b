package semtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokensem/tokensem"
)

// testDeleteRacingInit: clients Init a semaphore and take and return its
// permits in a loop while another client deletes it again and again
// (Delete, not forced), as semgroup's idle expiry does across replicas. A
// holder must either make the delete refuse or never get its permit: no
// permit is lost, the external meter never sees more than N holders across
// the semaphore's incarnations, every Init succeeds (waiting for a delete
// in progress), and once the deletes stop an Init finds it whole.
func testDeleteRacingInit(t *testing.T, b Backend) {
	if b.Delete == nil {
		t.Skip("the backend cannot delete")
	}
	name := uniqueName(t)
	const permits, workers, maxDeletes = 2, 3, 6
	o := Options{Lease: 3 * time.Second}
	mustInit(t, b, name, permits, o)

	var (
		m                                 Meter
		stop, lull                        atomic.Bool
		deleted, refused, acquired, inits atomic.Int64
		wg                                sync.WaitGroup
		errs                              = make(chan error, 64)
	)
	report := func(err error) {
		select {
		case errs <- err:
		default:
		}
	}
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				s, err := b.Init(t, b.Addr, name, permits, o)
				if err != nil {
					report(fmt.Errorf("worker %d: init: %w", w, err))
					return
				}
				inits.Add(1)
				for !stop.Load() {
					ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
					p, err := s.Acquire(ctx)
					cancel()
					if errors.Is(err, tokensem.ErrNotInitialized) {
						break // deleted: Init again
					}
					if err != nil {
						report(fmt.Errorf("worker %d: acquire: %w", w, err))
						return
					}
					acquired.Add(1)
					m.Enter()
					time.Sleep(2 * time.Millisecond)
					m.Leave()
					if err := p.Release(t.Context()); err != nil {
						report(fmt.Errorf("worker %d: release (fence %d): %w", w, p.Fence(), err))
					}
					time.Sleep(time.Duration(rand.IntN(30)) * time.Millisecond)
					for lull.Load() && !stop.Load() {
						time.Sleep(5 * time.Millisecond)
					}
				}
				_ = s.Close()
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer stop.Store(true)
		deadline := time.Now().Add(40 * time.Second)
		seen := int64(0) // permits taken when the last delete succeeded
		streak := 0      // deletes refused in a row
		for time.Now().Before(deadline) && deleted.Load() < maxDeletes {
			// A semaphore nobody uses since it was made again would be
			// deleted again before its Init could return, and again (a
			// cluster takes a second or two to make one): delete it once
			// it has been used, as an idle expiry would.
			if acquired.Load() == seen {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			// After three refusals in a row (the holders left no gap a
			// delete could use: a loaded machine, a slow cluster), the
			// workers take no new permit until this delete is done;
			// those already in Acquire still race it.
			lull.Store(streak >= 3)
			err := b.Delete(t, name, false)
			lull.Store(false)
			switch {
			case err == nil:
				deleted.Add(1)
				seen = acquired.Load()
				streak = 0
			case errors.Is(err, tokensem.ErrHeld):
				refused.Add(1)
				streak++
			case errors.Is(err, tokensem.ErrNotInitialized):
			default:
				report(fmt.Errorf("delete: %w", err))
				return
			}
			time.Sleep(time.Duration(rand.IntN(40)) * time.Millisecond)
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("%d deletes, %d refused; %d inits, %d permits taken; at most %d inside", deleted.Load(), refused.Load(), inits.Load(), acquired.Load(), m.Max())
	if m.Max() > permits {
		t.Errorf("the meter saw %d holders at once, with %d permits", m.Max(), permits)
	}
	if deleted.Load() == 0 || acquired.Load() == 0 {
		t.Fatalf("the race was not exercised: %d deletes, %d permits taken", deleted.Load(), acquired.Load())
	}

	s := mustInit(t, b, name, permits, o)
	var ps []tokensem.Permit
	defer func() { releaseAll(t, ps) }()
	for range permits {
		ps = append(ps, mustAcquire(t, s, 10*time.Second))
	}
	settled(t, s, "after the deletes stopped, Init found", func(st tokensem.Status) bool {
		return st.Permits == permits && st.Tokens == permits && st.Healthy && st.Held == permits
	})
}

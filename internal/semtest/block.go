package semtest

import (
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tokensem/tokensem"
)

// testBlocks: the block mode of a hierarchy. Regions eu and us (2 permits
// each) under global (3); each region's callers take global's permits from
// a Block of their region's own handle (as one process per region would),
// beside the region's permit, with AcquireAll. No limit is exceeded, the
// blocks reuse their global permits, and a block's caller is told when the
// global permit under its permit is lost (its connection paused past the
// lease).
func testBlocks(t *testing.T, b Backend) {
	eu, us, global := uniqueName(t), uniqueName(t), uniqueName(t)
	mustInit(t, b, eu, 2, Options{})
	mustInit(t, b, us, 2, Options{})
	mustInit(t, b, global, 3, Options{})

	var (
		mEU, mUS, mGlobal weightMeter
		wg                sync.WaitGroup
		mu                sync.Mutex
		fences            = map[uint64]int{} // global fences seen: holds per global permit
		holds             int
	)
	for r := range 2 {
		region, m := mustOpen(t, b, b.Addr, eu, Options{}), &mEU
		if r == 1 {
			region, m = mustOpen(t, b, b.Addr, us, Options{}), &mUS
		}
		block, err := tokensem.NewBlock(mustOpen(t, b, b.Addr, global, Options{}),
			tokensem.WithBlockReuse(4), tokensem.WithBlockIdle(20*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = block.Close() })
		for i := range 3 {
			sems := []tokensem.Semaphore{region, block}
			if i == 2 {
				sems = []tokensem.Semaphore{block, region}
			}
			wg.Go(func() {
				for round := range 6 {
					set, err := tokensem.AcquireAll(Context(t, 60*time.Second), sems...)
					if err != nil {
						t.Errorf("region %d caller %d round %d: %v", r, i, round, err)
						return
					}
					m.enter(1)
					mGlobal.enter(1)
					time.Sleep(10 * time.Millisecond)
					mGlobal.leave(1)
					m.leave(1)
					mu.Lock()
					holds++
					fences[set.Fences()[slices.Index(sems, tokensem.Semaphore(block))]]++
					mu.Unlock()
					if err := set.Release(t.Context()); err != nil {
						t.Errorf("region %d caller %d: release: %v", r, i, err)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	if g, e, u := mGlobal.max.Load(), mEU.max.Load(), mUS.max.Load(); g > 3 || e > 2 || u > 2 {
		t.Fatalf("most holders at once: global %d of 3, eu %d of 2, us %d of 2", g, e, u)
	}
	if len(fences) >= holds {
		t.Errorf("%d holds took %d global permits: the blocks reused none", holds, len(fences))
	}
	t.Logf("%d holds on %d global permits; most at once: global %d, eu %d, us %d",
		holds, len(fences), mGlobal.max.Load(), mEU.max.Load(), mUS.max.Load())

	// A block's caller learns of its global permit's loss.
	const lease = 2 * time.Second
	lossName := uniqueName(t)
	mustInit(t, b, lossName, 1, Options{Lease: lease})
	px, g := proxied(t, b, lossName, Options{})
	block, err := tokensem.NewBlock(g)
	if err != nil {
		t.Fatal(err)
	}
	defer block.Close()
	p, err := block.Acquire(Context(t, 20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	px.Pause()
	defer px.Resume()
	select {
	case <-p.Done():
	case <-time.After(6*lease + 20*time.Second):
		t.Fatal("a block's caller was not told that its global permit was lost")
	}
	if err := p.Err(); !errors.Is(err, tokensem.ErrLeaseLost) {
		t.Fatalf("Err after the global permit's loss: %v, want ErrLeaseLost", err)
	}
}

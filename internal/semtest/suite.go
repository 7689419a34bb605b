package semtest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/driver"
)

// Run runs the whole conformance suite against b: RunAlone, then
// RunBeside.
func Run(t *testing.T, b Backend) {
	RunAlone(t, b)
	RunBeside(t, b)
}

// RunAlone runs the suite's cases that measure every byte the process
// allocates (see allocated), one after another. Nothing else may run in
// the test process meanwhile: call it from a test that is not parallel.
func RunAlone(t *testing.T, b Backend) {
	t.Run("InvalidConfig", func(t *testing.T) { testInvalidConfig(t, b) })
}

// RunBeside runs the rest of the suite, its cases side by side. It may
// run beside the package's other tests (from a parallel test).
func RunBeside(t *testing.T, b Backend) {
	tests := []struct {
		name string
		fn   func(*testing.T, Backend)
	}{
		{"InitOpenStatus", testInitOpenStatus},
		{"InitIdempotentAndMismatch", testInitIdempotentAndMismatch},
		{"BadInput", testBadInput},
		{"TryAcquire", testTryAcquire},
		{"AtMostNUnderContention", testAtMostN},
		{"FIFO", testFIFO},
		{"PriorityClasses", testPriority},
		{"CancelStrandsNothing", testCancelStrandsNothing},
		{"CancelRaceStrandsNothing", testCancelRace},
		{"DoubleRelease", testDoubleRelease},
		{"FenceGrowsPerHandoff", testFence},
		{"SilentHolderLosesPermit", testSilentHolder},
		{"StaleHolderReleasesLate", testStaleRelease},
		{"CrashedHolder", testCrashedHolder},
		{"JunkInStore", testJunk},
		{"SignedTokens", testSigned},
		{"DoCancelsOnLoss", testDoCancelsOnLoss},
		{"Close", testClose},
		{"GrowSeenByStaleClient", testGrowSeenByStaleClient},
		{"ConcurrentResizeAndReconcile", testConcurrentAdmin},
		{"Delete", testDelete},
		{"DeleteRacingInit", testDeleteRacingInit},
		{"Count", testCount},
		{"WeightedBasics", testWeightedBasics},
		{"WeightedCancel", testWeightedCancel},
		{"WeightedMixed", testWeightedMixed},
		{"WeightedNoDeadlock", testWeightedNoDeadlock},
		{"WeightedNoStarvation", testWeightedNoStarvation},
		{"WeightedLowClass", testWeightedLowClass},
		{"WeightedLoss", testWeightedLoss},
		{"WeightedGateRepaired", testWeightedGateRepaired},
		{"WeightedAfterDelete", testWeightedAfterDelete},
		{"AcquireAll", testAcquireAll},
		{"Blocks", testBlocks},
		{"CancelReturnsCtxErr", testCancelReturnsCtxErr},
		{"UseReports", testUseReports},
		{"AdaptiveController", testAdaptiveController},
		{"ControllerRecord", testControllerRecord},
	}
	cases := make([]subtest, len(tests))
	for i, tc := range tests {
		cases[i] = subtest{tc.name, func(t *testing.T) { tc.fn(t, b) }}
	}
	runSideBySide(t, cases)
}

// sideBySide is how many of the suite's cases run at once. The cases wait
// on the broker far more than they compute (the natssem suite keeps a
// fifth of one core busy when its cases run one after another), and each
// works on semaphores of its own, so they run side by side. t.Parallel
// would not do: go test's -parallel (GOMAXPROCS by default) would cap them
// at two on a 2-core machine, and the suite's speed would depend on a flag
// its callers pass.
const sideBySide = 6

// subtest is one named case for runSideBySide.
type subtest struct {
	name string
	fn   func(*testing.T)
}

// runSideBySide runs cases as subtests of t, at most sideBySide at once,
// and returns when all have ended. testing allows t.Run from several
// goroutines while t's own function has not returned.
func runSideBySide(t *testing.T, cases []subtest) {
	slots := make(chan struct{}, sideBySide)
	var wg sync.WaitGroup
	for _, c := range cases {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			t.Run(c.name, c.fn)
		})
	}
	wg.Wait()
}

var nameSeq atomic.Int64

// RunID is in the name of every semaphore this test process makes on a
// broker that outlives it (uniqueName, and the packages' own name makers):
// it tells this run's semaphores from those of other runs, and
// testenv.Main deletes those that contain it once the tests are done.
var RunID = driver.NewToken("x", 0, 0).ID[:8]

// uniqueName returns a fresh semaphore name for a test.
func uniqueName(t testing.TB) string {
	base := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, t.Name())
	if len(base) > 40 {
		base = base[len(base)-40:]
	}
	return fmt.Sprintf("t%d-%s-%s", nameSeq.Add(1), RunID, strings.Trim(base, "-"))
}

func mustInit(t testing.TB, b Backend, name string, n int, o Options) tokensem.Semaphore {
	t.Helper()
	s, err := b.Init(t, b.Addr, name, n, o)
	if err != nil {
		t.Fatalf("init %s: %v", name, err)
	}
	if b.Delete != nil {
		// The suite deletes what it creates, so a long-lived development
		// broker does not fill up (runs after every Close below).
		t.Cleanup(func() {
			if err := b.Delete(t, name, true); err != nil && !errors.Is(err, tokensem.ErrNotInitialized) {
				t.Logf("deleting %s after the test: %v", name, err)
			}
		})
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func mustOpen(t testing.TB, b Backend, addr, name string, o Options) tokensem.Semaphore {
	t.Helper()
	s, err := b.Open(t, addr, name, o)
	if err != nil {
		t.Fatalf("open %s: %v", name, err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func mustAcquire(t testing.TB, s tokensem.Semaphore, d time.Duration) tokensem.Permit {
	t.Helper()
	p, err := s.Acquire(Context(t, d))
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	return p
}

func mustRelease(t testing.TB, p tokensem.Permit) {
	t.Helper()
	if err := p.Release(t.Context()); err != nil {
		t.Fatalf("release: %v", err)
	}
}

func status(t testing.TB, s tokensem.Semaphore) tokensem.Status {
	t.Helper()
	st, err := s.Status(Context(t, 10*time.Second))
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	return st
}

// settled returns a status for which want holds, reading it again for up
// to 3 s: on a replicated NATS semaphore Status reads the tokens and slot
// records from any replica, and one may lag a write acknowledged a moment
// ago (a released slot still held, a removed token still counted). It
// fails the test with the last status read if want never holds.
func settled(t testing.TB, s tokensem.Semaphore, what string, want func(tokensem.Status) bool) tokensem.Status {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for {
		st := status(t, s)
		if want(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %+v", what, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// drainAll takes every permit with TryAcquire and returns them; it proves
// how many tokens are usable right now.
func drainAll(t testing.TB, s tokensem.Semaphore, limit int) []tokensem.Permit {
	t.Helper()
	var ps []tokensem.Permit
	for len(ps) <= limit {
		p, err := s.TryAcquire(Context(t, 5*time.Second))
		if errors.Is(err, tokensem.ErrNoPermit) {
			break
		}
		if err != nil {
			t.Fatalf("try acquire: %v", err)
		}
		ps = append(ps, p)
	}
	return ps
}

func releaseAll(t testing.TB, ps []tokensem.Permit) {
	t.Helper()
	for _, p := range ps {
		mustRelease(t, p)
	}
}

func testInitOpenStatus(t *testing.T, b Backend) {
	name := uniqueName(t)
	mustInit(t, b, name, 3, Options{})
	s := mustOpen(t, b, b.Addr, name, Options{})
	st := settled(t, s, "fresh status", func(st tokensem.Status) bool {
		return st.Name == name && st.Backend == b.Name && st.Permits == 3 && st.Tokens == 3 &&
			st.Available == 3 && st.Held == 0 && st.Healthy && len(st.Duplicate) == 0 && len(st.Missing) == 0 && st.Invalid == 0
	})
	if st.Resource == "" {
		t.Fatalf("status names no broker resource: %+v", st)
	}
	p := mustAcquire(t, s, 5*time.Second)
	settled(t, s, "status with one holder and nobody waiting", func(st tokensem.Status) bool {
		return st.Held == 1 && st.Available == 2 && st.Waiting == 0 && st.Healthy
	})
	mustRelease(t, p)
	eventually(t, 5*time.Second, "permit back", func() bool { st := status(t, s); return st.Available == 3 && st.Held == 0 })
}

func testInitIdempotentAndMismatch(t *testing.T, b Backend) {
	name := uniqueName(t)
	// Concurrent inits, as a deployment's init containers would run them.
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() {
			s, err := b.Init(t, b.Addr, name, 5, Options{})
			if err == nil {
				_ = s.Close()
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("concurrent init %d: %v", i, err)
		}
	}
	s := mustInit(t, b, name, 5, Options{})
	settled(t, s, "after 5 inits", func(st tokensem.Status) bool { return st.Tokens == 5 && st.Healthy })
	_, err := b.Init(t, b.Addr, name, 6, Options{})
	if !errors.Is(err, tokensem.ErrPermitMismatch) {
		t.Fatalf("init with another N: err = %v, want ErrPermitMismatch", err)
	}
	var pm *tokensem.PermitMismatchError
	if !errors.As(err, &pm) || pm.Name != name || pm.Have != 5 || pm.Want != 6 {
		t.Fatalf("init with another N: err = %v, want a PermitMismatchError of %s with 5 and 6", err, name)
	}
	settled(t, s, "a refused init changed the semaphore", func(st tokensem.Status) bool {
		return st.Tokens == 5 && st.Healthy && st.Permits == 5
	})
}

func testBadInput(t *testing.T, b Backend) {
	cases := []struct {
		name    string
		sem     string
		permits int
		o       Options
		wantErr error
	}{
		{"empty name", "", 1, Options{}, tokensem.ErrInvalidName},
		{"dot in name", "a.b", 1, Options{}, tokensem.ErrInvalidName},
		{"wildcard", "a*", 1, Options{}, tokensem.ErrInvalidName},
		{"space", "a b", 1, Options{}, tokensem.ErrInvalidName},
		{"leading dash", "-a", 1, Options{}, tokensem.ErrInvalidName},
		{"too long", strings.Repeat("a", tokensem.MaxNameLen+1), 1, Options{}, tokensem.ErrInvalidName},
		{"zero permits", uniqueName(t), 0, Options{}, tokensem.ErrInvalidPermits},
		{"negative permits", uniqueName(t), -3, Options{}, tokensem.ErrInvalidPermits},
		{"lease too short", uniqueName(t), 1, Options{Lease: time.Millisecond}, tokensem.ErrInvalidOption},
		{"short key", uniqueName(t), 1, Options{Key: []byte("short")}, tokensem.ErrInvalidOption},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := b.Init(t, b.Addr, tc.sem, tc.permits, tc.o)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Init(%q, %d) err = %v, want %v", tc.sem, tc.permits, err, tc.wantErr)
			}
		})
	}
	t.Run("open missing", func(t *testing.T) {
		_, err := b.Open(t, b.Addr, uniqueName(t), Options{})
		if !errors.Is(err, tokensem.ErrNotInitialized) {
			t.Fatalf("Open of a missing semaphore: err = %v, want ErrNotInitialized", err)
		}
	})
	t.Run("open bad name", func(t *testing.T) {
		_, err := b.Open(t, b.Addr, "no/slash", Options{})
		if !errors.Is(err, tokensem.ErrInvalidName) {
			t.Fatalf("err = %v, want ErrInvalidName", err)
		}
	})
}

func testTryAcquire(t *testing.T, b Backend) {
	s := mustInit(t, b, uniqueName(t), 3, Options{})
	ps := drainAll(t, s, 3)
	if len(ps) != 3 {
		t.Fatalf("TryAcquire got %d permits of 3", len(ps))
	}
	seen := map[int]bool{}
	for _, p := range ps {
		if seen[p.Token().Index] {
			t.Fatalf("two permits of slot %d", p.Token().Index)
		}
		seen[p.Token().Index] = true
		if p.Err() != nil {
			t.Fatalf("held permit has Err %v", p.Err())
		}
	}
	if _, err := s.TryAcquire(t.Context()); !errors.Is(err, tokensem.ErrNoPermit) {
		t.Fatalf("4th TryAcquire: err = %v, want ErrNoPermit", err)
	}
	mustRelease(t, ps[0])
	p, err := s.TryAcquire(Context(t, 5*time.Second))
	if err != nil {
		t.Fatalf("TryAcquire after a release: %v", err)
	}
	releaseAll(t, append(ps[1:], p))
}

// testAtMostN runs 60 goroutines on 4 clients contending for 3 permits and
// meters the concurrency the holders observe.
func testAtMostN(t *testing.T, b Backend) {
	const n, workers, clients, rounds = 3, 60, 4, 5
	name := uniqueName(t)
	mustInit(t, b, name, n, Options{})
	sems := make([]tokensem.Semaphore, clients)
	for i := range sems {
		sems[i] = mustOpen(t, b, b.Addr, name, Options{})
	}
	var m Meter
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			s := sems[w%clients]
			for range rounds {
				err := tokensem.Do(Context(t, 60*time.Second), s, func(ctx context.Context) error {
					m.Enter()
					defer m.Leave()
					time.Sleep(time.Millisecond)
					return ctx.Err()
				})
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("worker: %v", err)
	}
	if m.Max() > n {
		t.Fatalf("observed %d concurrent holders of %d permits", m.Max(), n)
	}
	if m.Max() < n {
		t.Fatalf("contention never used all %d permits (max %d): the test proves nothing", n, m.Max())
	}
	if m.Total() != workers*rounds {
		t.Fatalf("%d acquisitions, want %d", m.Total(), workers*rounds)
	}
	settled(t, sems[0], "after the run", func(st tokensem.Status) bool {
		return st.Healthy && st.Held == 0 && st.Available == n
	})
	t.Logf("%d acquisitions by %d workers, max concurrency %d of %d", m.Total(), workers, m.Max(), n)
}

// testFIFO starts waiters one at a time, each only after the broker counts
// it as waiting, and checks they are served in that order, unless a waiter
// lost its place meanwhile (see ReissueMessage).
func testFIFO(t *testing.T, b Backend) {
	const waiters = 6
	name := uniqueName(t)
	s := mustInit(t, b, name, 1, Options{})
	holder := mustAcquire(t, s, 5*time.Second)
	order, reissued := serveQueued(t, b, name, s, holder, make([]tokensem.Priority, waiters))
	if n, why := reissued.count(); n != 0 {
		// A waiter that lost its place (a consumer's leader change ends
		// every pull waiting on it) asks again at the back of the queue:
		// the order is not promised then, only that everyone is served.
		t.Logf("%d waiting pulls re-issued during the run (last: %s); service order %v", n, why, order)
	} else {
		for i, w := range order {
			if w != i {
				t.Fatalf("service order %v, want 0..%d in order", order, waiters-1)
			}
		}
	}
	if len(order) != waiters {
		t.Fatalf("served %d of %d waiters", len(order), waiters)
	}
}

// serveQueued queues one waiter per class in classes on semaphore name,
// each on a handle of its own and each once the one before is counted
// waiting, then releases holder and returns the order they were served
// in (indices into classes), and the waits that were asked again meanwhile.
func serveQueued(t *testing.T, b Backend, name string, s tokensem.Semaphore, holder tokensem.Permit, classes []tokensem.Priority) ([]int, reissues) {
	reissued := newReissues()
	var (
		mu    sync.Mutex
		order []int
		wg    sync.WaitGroup
	)
	for i, class := range classes {
		c := mustOpen(t, b, b.Addr, name, Options{Logger: slog.New(reissued)})
		ctx := tokensem.WithPriority(Context(t, 30*time.Second), class)
		wg.Go(func() {
			p, err := c.Acquire(ctx)
			if err != nil {
				t.Errorf("waiter %d (class %d): %v", i, class, err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			if err := p.Release(t.Context()); err != nil {
				t.Errorf("waiter %d release: %v", i, err)
			}
		})
		eventually(t, 10*time.Second, fmt.Sprintf("waiter %d queued", i), func() bool {
			return status(t, s).Waiting >= i+1
		})
	}
	mustRelease(t, holder)
	wg.Wait()
	return order, reissued
}

// testCancelStrandsNothing: callers that time out or are cancelled while
// waiting must not keep the token a later release hands to them. The lease
// is long, so a stranded token would stay away far longer than the test
// waits.
func testCancelStrandsNothing(t *testing.T, b Backend) {
	name := uniqueName(t)
	s := mustInit(t, b, name, 1, Options{Lease: 60 * time.Second})
	holder := mustAcquire(t, s, 5*time.Second)

	if _, err := s.Acquire(Context(t, 200*time.Millisecond)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("timed-out Acquire: err = %v, want DeadlineExceeded", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { _, err := s.Acquire(ctx); done <- err }()
	eventually(t, 10*time.Second, "waiter queued", func() bool { return status(t, s).Waiting >= 1 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Acquire: err = %v, want Canceled", err)
	}
	// An already-done context fails at once and changes nothing.
	if _, err := s.Acquire(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire with a done ctx: err = %v", err)
	}
	mustRelease(t, holder)
	var p tokensem.Permit
	eventually(t, 10*time.Second, "the released token to be free again", func() bool {
		var err error
		p, err = s.TryAcquire(t.Context())
		return err == nil
	})
	mustRelease(t, p)
}

// testCancelRace releases tokens while many waiters give up at the same
// moment; afterwards every token must be free again well inside the lease.
// The waiters are spread over two handles, ten each: natssem keeps the
// inbox of at most 16 callers of one Semaphore that gave up with a pull
// queued on a cluster (maxLingering); a token sent to a 17th's inbox as it
// drains may wait out a lease (docs/guarantees.md).
func testCancelRace(t *testing.T, b Backend) {
	const n, waiters = 3, 20
	name := uniqueName(t)
	s := mustInit(t, b, name, n, Options{Lease: 60 * time.Second})
	cs := []tokensem.Semaphore{mustOpen(t, b, b.Addr, name, Options{}), mustOpen(t, b, b.Addr, name, Options{})}
	for round := range 3 {
		// Acquire, not TryAcquire: a permit the other client released in
		// the last round is free by its record (Status counts it) a moment
		// before the broker has its token back, which this client's
		// TryAcquire cannot wait for. A stranded permit fails Acquire.
		held := takeAll(t, s, n)
		if extra := drainAll(t, s, 1); len(extra) != 0 {
			t.Fatalf("round %d: more than %d permits free", round, n)
		}
		var wg sync.WaitGroup
		ctx, cancel := context.WithCancel(t.Context())
		var won []tokensem.Permit
		var mu sync.Mutex
		for i := range waiters {
			wg.Go(func() {
				p, err := cs[i%len(cs)].Acquire(ctx)
				if err == nil {
					mu.Lock()
					won = append(won, p)
					mu.Unlock()
				}
			})
		}
		eventually(t, 10*time.Second, "waiters queued", func() bool { return status(t, s).Waiting >= waiters/2 })
		go releaseAllAsync(held)
		time.Sleep(time.Duration(round) * time.Millisecond)
		cancel()
		wg.Wait()
		releaseAll(t, won)
		eventually(t, 15*time.Second, "all permits free after the cancel race", func() bool {
			st := status(t, s)
			return st.Available == n && st.Held == 0
		})
	}
}

func releaseAllAsync(ps []tokensem.Permit) {
	for _, p := range ps {
		_ = p.Release(context.Background())
	}
}

func testDoubleRelease(t *testing.T, b Backend) {
	s := mustInit(t, b, uniqueName(t), 2, Options{})
	p := mustAcquire(t, s, 5*time.Second)
	mustRelease(t, p)
	select {
	case <-p.Done():
	default:
		t.Fatal("Done not closed after Release")
	}
	if err := p.Release(t.Context()); !errors.Is(err, tokensem.ErrReleased) {
		t.Fatalf("second Release: err = %v, want ErrReleased", err)
	}
	if !errors.Is(p.Err(), tokensem.ErrReleased) {
		t.Fatalf("Err after release = %v", p.Err())
	}
	eventually(t, 5*time.Second, "two free permits", func() bool { return status(t, s).Available == 2 })
	ps := drainAll(t, s, 2)
	if len(ps) != 2 {
		t.Fatalf("after a double release %d permits are free, want exactly 2", len(ps))
	}
	releaseAll(t, ps)
}

func testFence(t *testing.T, b Backend) {
	s := mustInit(t, b, uniqueName(t), 1, Options{})
	var last uint64
	for i := range 5 {
		p := mustAcquire(t, s, 5*time.Second)
		if p.Fence() <= last {
			t.Fatalf("acquire %d: fence %d not above the previous %d", i, p.Fence(), last)
		}
		last = p.Fence()
		mustRelease(t, p)
	}
}

func testJunk(t *testing.T, b Backend) {
	name := uniqueName(t)
	s := mustInit(t, b, name, 2, Options{})
	b.InjectRaw(t, name, []byte("this is not a token"))
	b.InjectRaw(t, name, nil)
	other, _ := driver.Codec{}.Encode(driver.NewToken("some-other-semaphore", 0, 1))
	b.InjectRaw(t, name, other)
	settled(t, s, "status with junk, want 3 invalid and unhealthy", func(st tokensem.Status) bool {
		return st.Invalid == 3 && !st.Healthy
	})
	var m Meter
	for range 3 {
		ps := drainAll(t, s, 5)
		for range ps {
			m.Enter()
		}
		if len(ps) != 2 {
			t.Fatalf("with junk in the store %d permits were granted, want 2", len(ps))
		}
		for _, p := range ps {
			if p.Token().Semaphore != name {
				t.Fatalf("granted a foreign token %v", p.Token())
			}
			m.Leave()
		}
		releaseAll(t, ps)
	}
}

func testSigned(t *testing.T, b Backend) {
	key := []byte("0123456789abcdef-shared-secret")
	name := uniqueName(t)
	s := mustInit(t, b, name, 1, Options{Key: key})
	if _, err := b.Open(t, b.Addr, name, Options{}); !errors.Is(err, tokensem.ErrKeyMismatch) {
		t.Fatalf("Open without the key: err = %v, want ErrKeyMismatch", err)
	}
	if _, err := b.Open(t, b.Addr, name, Options{Key: []byte("another key of 16+ bytes")}); !errors.Is(err, tokensem.ErrKeyMismatch) {
		t.Fatalf("Open with a wrong key: err = %v, want ErrKeyMismatch", err)
	}
	// Forgeries: an unsigned token and one signed with another key, both for
	// slot 0 of the right semaphore and epoch.
	unsigned, _ := driver.Codec{}.Encode(driver.NewToken(name, 0, 1))
	forged, _ := driver.NewCodec([]byte("attacker key 0123456789")).Encode(driver.NewToken(name, 0, 1))
	b.InjectRaw(t, name, unsigned)
	b.InjectRaw(t, name, forged)
	settled(t, s, "status with forgeries", func(st tokensem.Status) bool { return st.Invalid == 2 && st.Tokens == 3 })
	ps := drainAll(t, s, 3)
	if len(ps) != 1 {
		t.Fatalf("%d permits granted with one real token and two forgeries", len(ps))
	}
	releaseAll(t, ps)
}

func testClose(t *testing.T, b Backend) {
	name := uniqueName(t)
	s := mustInit(t, b, name, 1, Options{})
	c := mustOpen(t, b, b.Addr, name, Options{})
	p := mustAcquire(t, s, 5*time.Second)
	done := make(chan error, 1)
	go func() { _, err := c.Acquire(t.Context()); done <- err }()
	eventually(t, 10*time.Second, "waiter queued", func() bool { return status(t, s).Waiting >= 1 })
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, tokensem.ErrClosed) {
		t.Fatalf("Acquire interrupted by Close: err = %v, want ErrClosed", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := c.TryAcquire(t.Context()); !errors.Is(err, tokensem.ErrClosed) {
		t.Fatalf("TryAcquire after Close: err = %v", err)
	}
	if _, err := c.Status(t.Context()); !errors.Is(err, tokensem.ErrClosed) {
		t.Fatalf("Status after Close: err = %v", err)
	}
	mustRelease(t, p)
	eventually(t, 10*time.Second, "permit free", func() bool { return status(t, s).Available == 1 })
}

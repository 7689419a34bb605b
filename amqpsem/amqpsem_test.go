package amqpsem_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/amqpsem"
	"github.com/tokensem/tokensem/driver"
	"github.com/tokensem/tokensem/internal/faultproxy"
	"github.com/tokensem/tokensem/internal/semtest"
)

// name returns a fresh semaphore name for a test, marked with
// semtest.RunID (testenv.Main deletes them after the run).
func name(t *testing.T) string {
	return fmt.Sprintf("a%s%d-%s", semtest.RunID, nameSeq.Add(1), t.Name()[4:min(len(t.Name()), 30)])
}

var nameSeq atomic.Int64

func initAMQP(t *testing.T, n string, permits int, opts ...amqpsem.Option) *amqpsem.Semaphore {
	t.Helper()
	return defaultPlace().init(t, n, permits, opts...)
}

// TestTokenSurvivesManyReturns: RabbitMQ 4.x drops a quorum-queue message
// silently after 20 returns unless the queue disables the limit, and on
// 3.x the argument that disables it there would drop the token at once.
// Whatever the broker, the token must survive.
func TestTokenSurvivesManyReturns(t *testing.T) {
	s := initAMQP(t, name(t), 1)
	var last uint64
	for i := range 30 {
		p, err := s.Acquire(semtest.Context(t, 5*time.Second))
		if err != nil {
			t.Fatalf("acquire %d: the token was dropped: %v", i, err)
		}
		if p.Fence() <= last {
			t.Fatalf("fence %d after %d", p.Fence(), last)
		}
		last = p.Fence()
		if err := p.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("server %s: token returned 30 times, fence %d", dialServerVersion(t), last)
}

func dialServerVersion(t *testing.T) string { return dial(t, broker.Addr, 0).ServerVersion() }

// TestDuplicateTokenCannotAdmitTwoHolders: a copy of a held slot's token
// is refused by the slot's claim queue.
func TestDuplicateTokenCannotAdmitTwoHolders(t *testing.T) {
	n := name(t)
	a := initAMQP(t, n, 1)
	pa, err := a.Acquire(semtest.Context(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	copyTok, _ := driver.Codec{}.Encode(driver.NewToken(n, 0, pa.Token().Epoch))
	amqpBackend().InjectRaw(t, n, copyTok)
	b, err := amqpsem.Open(t.Context(), dial(t, broker.Addr, 0), n)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := b.Acquire(semtest.Context(t, time.Second)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second holder of slot 0 via its copy: err = %v", err)
	}
	st, err := a.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st.Tokens != 2 || len(st.Duplicate) != 1 || st.Duplicate[0] != 0 || st.Held != 1 {
		t.Fatalf("status with a duplicate of a held slot: %+v", st)
	}
	if err := pa.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	pb, err := b.Acquire(semtest.Context(t, 5*time.Second))
	if err != nil {
		t.Fatalf("after the release: %v", err)
	}
	_ = pb.Release(t.Context())
}

// TestMaxHold: the client gives the permit back itself after the maximum
// hold, before the broker's consumer_timeout would.
func TestMaxHold(t *testing.T) {
	n := name(t)
	initAMQP(t, n, 1)
	s, err := amqpsem.Open(t.Context(), dial(t, broker.Addr, 0), n, amqpsem.WithMaxHold(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p, err := s.Acquire(semtest.Context(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed after the maximum hold")
	}
	if !errors.Is(p.Err(), tokensem.ErrLeaseLost) {
		t.Fatalf("Err = %v", p.Err())
	}
	q, err := s.Acquire(semtest.Context(t, 5*time.Second))
	if err != nil {
		t.Fatalf("token not back after the maximum hold: %v", err)
	}
	_ = q.Release(t.Context())
}

// TestReconnect cuts a client's connection: its permit is reported lost at
// once, while its waiting Acquire subscribes again on the new connection
// and gets a permit later.
func TestReconnect(t *testing.T) {
	n := name(t)
	other := initAMQP(t, n, 2)
	px, err := faultproxy.New(broker.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	c := dial(t, px.Addr(), 0)
	s, err := amqpsem.Open(t.Context(), c, n)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	held, err := s.Acquire(semtest.Context(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	blocker, err := other.Acquire(semtest.Context(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		p, err := s.Acquire(semtest.Context(t, 30*time.Second))
		if err == nil {
			err = p.Release(context.Background())
		}
		got <- err
	}()
	time.Sleep(200 * time.Millisecond) // the waiter subscribes
	cut := time.Now()
	px.Cut()
	select {
	case <-held.Done():
		t.Logf("held permit reported lost %v after the cut: %v", time.Since(cut).Round(time.Millisecond), held.Err())
	case <-time.After(5 * time.Second):
		t.Fatal("permit on a cut connection not reported lost")
	}
	if !errors.Is(held.Err(), tokensem.ErrLeaseLost) {
		t.Fatalf("Err = %v", held.Err())
	}
	// The cut returned the held token; the re-subscribed waiter gets it.
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("waiter across the reconnect: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("waiter never got a permit after the reconnect")
	}
	_ = blocker.Release(t.Context())
}

// TestConcurrentInitOneConn: Inits sharing one connection are serialized
// too (the broker's exclusive lock queue only keeps other connections out).
func TestConcurrentInitOneConn(t *testing.T) {
	n := name(t)
	c := dial(t, broker.Addr, 0)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() {
			s, err := amqpsem.Init(t.Context(), c, n, 3)
			if err == nil {
				_ = s.Close()
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	s, err := amqpsem.Open(t.Context(), c, n)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	st, err := s.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st.Tokens != 3 || !st.Healthy {
		t.Fatalf("after 4 concurrent Inits on one connection: %+v", st)
	}
}

// TestListBackToBack: Lists in a row, from two connections, each see
// every semaphore: a List puts the registry's entries back before the
// next one may read (one List right after another once missed an entry,
// under load).
func TestListBackToBack(t *testing.T) {
	p := ownPlace(t) // a List reads the whole vhost
	var names []string
	for i := range 3 {
		n := name(t) + "-" + strconv.Itoa(i)
		names = append(names, n)
		p.init(t, n, 1)
	}
	conns := []*amqpsem.Conn{p.dial(t), p.dial(t)}
	for i := range 6 {
		infos, err := amqpsem.List(semtest.Context(t, time.Minute), conns[i%2])
		if err != nil {
			t.Fatalf("list %d: %v", i, err)
		}
		found := 0
		for _, in := range infos {
			if slices.Contains(names, in.Name) {
				found++
			}
		}
		if found != len(names) {
			t.Fatalf("list %d found %d of the %d semaphores", i, found, len(names))
		}
	}
}

// TestListBesideInits: a List sees every semaphore whose Init returned
// before the List began, while other Inits and Lists run beside it. A
// List puts the entries it read back before the next reader counts them;
// an Init publishing meanwhile must not make the next reader miss one.
func TestListBesideInits(t *testing.T) {
	p := ownPlace(t) // a List reads the whole vhost
	ctx := semtest.Context(t, 3*time.Minute)
	var (
		mu   sync.Mutex
		made []string
	)
	done := make(chan struct{})
	var wg sync.WaitGroup
	c := p.dial(t)
	wg.Go(func() {
		defer close(done)
		for i := range 12 {
			n := name(t) + "-" + strconv.Itoa(i)
			s, err := amqpsem.Init(ctx, c, n, 1)
			if err != nil {
				t.Errorf("init %s: %v", n, err)
				return
			}
			_ = s.Close()
			t.Cleanup(func() { _ = amqpsem.ForceDelete(semtest.CleanupContext(t, time.Minute), c, n) })
			mu.Lock()
			made = append(made, n)
			mu.Unlock()
		}
	})
	for r := range 3 {
		c := p.dial(t)
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				case <-time.After(100 * time.Millisecond): // others use the registry too
				}
				mu.Lock()
				want := slices.Clone(made)
				mu.Unlock()
				infos, err := amqpsem.List(ctx, c)
				if err != nil {
					t.Errorf("lister %d, list %d: %v", r, i, err)
					return
				}
				for _, n := range want {
					if !slices.ContainsFunc(infos, func(in tokensem.Info) bool { return in.Name == n }) {
						t.Errorf("lister %d, list %d misses %s, whose Init returned before the list began (%d listed)", r, i, n, len(infos))
						return
					}
				}
			}
		})
	}
	wg.Wait()
}

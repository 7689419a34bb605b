package semgroup_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/semgroup"
)

// TestConcurrentFirstUseOpensOnce starts many first uses of one key while
// its open is held back: the InitFunc runs once and every caller gets a
// permit of the same semaphore.
func TestConcurrentFirstUseOpensOnce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, init semgroup.InitFunc) {
		const callers = 12
		tr := track(init)
		gate := make(chan struct{})
		entered := make(chan struct{}, 1)
		slow := func(ctx context.Context, name string, n int) (tokensem.Semaphore, error) {
			select {
			case entered <- struct{}{}:
			default:
			}
			select {
			case <-gate:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return tr.Init(ctx, name, n)
		}
		prefix := uniquePrefix()
		g := newGroup(t, slow, callers, semgroup.WithPrefix(prefix))

		ctx := bounded(t)
		var started sync.WaitGroup
		var wg sync.WaitGroup
		permits := make(chan *semgroup.Permit, callers)
		errs := make(chan error, callers)
		for range callers {
			started.Add(1)
			wg.Go(func() {
				started.Done()
				p, err := g.Acquire(ctx, "shared")
				if err != nil {
					errs <- err
					return
				}
				permits <- p
			})
		}
		started.Wait()
		<-entered
		close(gate)
		wg.Wait()
		close(permits)
		close(errs)
		for err := range errs {
			t.Fatalf("Acquire: %v", err)
		}
		slots := map[int]bool{}
		for p := range permits {
			slots[p.Token().Index] = true
			if err := p.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if len(slots) != callers {
			t.Fatalf("%d distinct slots held by %d callers", len(slots), callers)
		}
		if inits, _ := tr.counts(prefix + "shared"); inits != 1 {
			t.Fatalf("InitFunc ran %d times for one key, want 1", inits)
		}
		st, err := g.Status(ctx, "shared")
		if err != nil {
			t.Fatal(err)
		}
		if st.Permits != callers || st.Available != callers {
			t.Fatalf("status: %d permits, %d available; want %d and %d", st.Permits, st.Available, callers, callers)
		}
	})
}

// TestOpenDoesNotBlockOtherKeys holds one key's open and uses another.
func TestOpenDoesNotBlockOtherKeys(t *testing.T) {
	init := natsInit(t)
	gate := make(chan struct{})
	defer close(gate)
	entered := make(chan struct{})
	prefix := uniquePrefix()
	blocking := func(ctx context.Context, name string, n int) (tokensem.Semaphore, error) {
		if name == prefix+"stuck" {
			close(entered)
			select {
			case <-gate:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return init(ctx, name, n)
	}
	g := newGroup(t, blocking, 1, semgroup.WithPrefix(prefix))

	stuckCtx, cancel := context.WithCancel(bounded(t))
	stuck := make(chan error, 1)
	go func() {
		_, err := g.Acquire(stuckCtx, "stuck")
		stuck <- err
	}()
	<-entered
	if err := g.Do(bounded(t), "free", func(context.Context) error { return nil }); err != nil {
		t.Fatalf("another key while one open is stuck: %v", err)
	}
	// A caller that gives up is not stuck with the open.
	cancel()
	if err := <-stuck; !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire of the stuck key = %v, want context.Canceled", err)
	}
}

// TestEviction checks the cache bound, that an evicted idle semaphore is
// closed, and that one with a held permit or a waiting Acquire is closed
// only after its last use.
func TestEviction(t *testing.T) {
	forEachBackend(t, func(t *testing.T, init semgroup.InitFunc) {
		tr := track(init)
		prefix := uniquePrefix()
		g := newGroup(t, tr.Init, 1, semgroup.WithPrefix(prefix), semgroup.WithMaxSize(2))
		ctx := bounded(t)
		use := func(key string) {
			t.Helper()
			if err := g.Do(ctx, key, func(context.Context) error { return nil }); err != nil {
				t.Fatalf("Do(%s): %v", key, err)
			}
			if n := g.Len(); n > 2 {
				t.Fatalf("%d keys cached, bound 2", n)
			}
		}
		counts := func(key string, wantInits, wantCloses int) {
			t.Helper()
			if inits, closes := tr.counts(prefix + key); inits != wantInits || closes != wantCloses {
				t.Fatalf("%s: %d inits, %d closes; want %d, %d", key, inits, closes, wantInits, wantCloses)
			}
		}

		use("a")
		use("b")
		use("a") // a is now the most recent
		use("c") // evicts b
		counts("a", 1, 0)
		counts("b", 1, 1)
		counts("c", 1, 0)
		use("b") // opened again, evicts a
		counts("b", 2, 1)
		counts("a", 1, 1)

		// d: one permit held, one caller waiting, then evicted.
		held, err := g.Acquire(ctx, "d")
		if err != nil {
			t.Fatal(err)
		}
		waited := make(chan *semgroup.Permit, 1)
		waitErr := make(chan error, 1)
		go func() {
			p, err := g.Acquire(ctx, "d")
			if err != nil {
				waitErr <- err
				return
			}
			waited <- p
		}()
		waitFor(t, "a waiter on d", func() bool {
			st, err := g.Status(ctx, "d")
			return err == nil && st.Waiting == 1
		})
		use("e")
		use("f") // evicts d, which is in use
		counts("d", 1, 0)
		if err := held.Err(); err != nil {
			t.Fatalf("held permit of evicted d: %v", err)
		}
		if err := held.Release(ctx); err != nil {
			t.Fatalf("releasing the permit of evicted d: %v", err)
		}
		var next *semgroup.Permit
		select {
		case next = <-waited:
		case err := <-waitErr:
			t.Fatalf("waiter on evicted d: %v", err)
		}
		counts("d", 1, 0) // the waiter's permit still uses it
		if err := next.Release(ctx); err != nil {
			t.Fatal(err)
		}
		counts("d", 1, 1)
		if err := next.Release(ctx); !errors.Is(err, tokensem.ErrReleased) {
			t.Fatalf("second Release = %v, want ErrReleased", err)
		}
		counts("d", 1, 1)

		// Both permits came back to the broker.
		st, err := g.Status(ctx, "d")
		if err != nil {
			t.Fatal(err)
		}
		if st.Available != 1 || st.Held != 0 {
			t.Fatalf("d after its evicted use: %d available, %d held; want 1, 0", st.Available, st.Held)
		}
		if g.Len() != 2 {
			t.Fatalf("%d keys cached, want 2", g.Len())
		}
	})
}

func TestPermitMismatch(t *testing.T) {
	forEachBackend(t, func(t *testing.T, init semgroup.InitFunc) {
		prefix := uniquePrefix()
		ctx := bounded(t)
		existing, err := init(ctx, prefix+"m", 3)
		if err != nil {
			t.Fatal(err)
		}
		defer existing.Close()

		tr := track(init)
		g := newGroup(t, tr.Init, 5, semgroup.WithPrefix(prefix))
		for attempt := 1; attempt <= 2; attempt++ {
			_, err := g.Acquire(ctx, "m")
			if !errors.Is(err, tokensem.ErrPermitMismatch) {
				t.Fatalf("Acquire = %v, want ErrPermitMismatch", err)
			}
			if inits, _ := tr.counts(prefix + "m"); inits != attempt {
				t.Fatalf("%d inits after %d attempts: a failed open must not be cached", inits, attempt)
			}
		}
		if g.Len() != 0 {
			t.Fatalf("%d keys cached after failed opens", g.Len())
		}
	})
}

func TestBadKey(t *testing.T) {
	init := natsInit(t)
	tr := track(init)
	g := newGroup(t, tr.Init, 1, semgroup.WithPrefix("tenant-"))
	for _, key := range []string{"", "a.b", "a b", "tenant/1", "*", strings.Repeat("k", tokensem.MaxNameLen)} {
		t.Run(key, func(t *testing.T) {
			if _, err := g.Acquire(bounded(t), key); !errors.Is(err, tokensem.ErrInvalidName) {
				t.Fatalf("Acquire(%q) = %v, want ErrInvalidName", key, err)
			}
			if err := g.Do(bounded(t), key, func(context.Context) error { return nil }); !errors.Is(err, tokensem.ErrInvalidName) {
				t.Fatalf("Do(%q) = %v, want ErrInvalidName", key, err)
			}
		})
	}
	if n := tr.totalInits(); n != 0 {
		t.Fatalf("bad keys reached the broker %d times", n)
	}
	// Without a prefix, a key may not start with '-'.
	g2 := newGroup(t, tr.Init, 1)
	if _, err := g2.Status(bounded(t), "-x"); !errors.Is(err, tokensem.ErrInvalidName) {
		t.Fatalf("Status(-x) = %v, want ErrInvalidName", err)
	}
}

func TestPermitsFunc(t *testing.T) {
	init := natsInit(t)
	prefix := uniquePrefix()
	g := newGroup(t, init, 2, semgroup.WithPrefix(prefix), semgroup.WithPermitsFunc(func(key string) int {
		switch key {
		case "big":
			return 5
		case "bad":
			return -1
		default:
			return 0 // the group's default
		}
	}))
	for _, tc := range []struct {
		key     string
		want    int
		wantErr error
	}{
		{"big", 5, nil},
		{"other", 2, nil},
		{"bad", 0, tokensem.ErrInvalidPermits},
	} {
		t.Run(tc.key, func(t *testing.T) {
			st, err := g.Status(bounded(t), tc.key)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Status = %v, want %v", err, tc.wantErr)
			}
			if err == nil && (st.Permits != tc.want || st.Name != prefix+tc.key) {
				t.Fatalf("semaphore %q has %d permits, want %q with %d", st.Name, st.Permits, prefix+tc.key, tc.want)
			}
		})
	}
}

// TestKeyFilter: every call with a key the filter refuses fails with
// ErrKeyNotAllowed and makes no semaphore; allowed keys work.
func TestKeyFilter(t *testing.T) {
	forEachBackend(t, func(t *testing.T, init semgroup.InitFunc) {
		tr := track(init)
		prefix := uniquePrefix()
		g, err := semgroup.New(tr.Init, 1, semgroup.WithPrefix(prefix), semgroup.WithKeyFilter(semgroup.AllowKeys("ok")))
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		ctx := bounded(t)
		calls := map[string]func(key string) error{
			"Acquire":    func(k string) error { _, err := g.Acquire(ctx, k); return err },
			"TryAcquire": func(k string) error { _, err := g.TryAcquire(ctx, k); return err },
			"Open":       func(k string) error { return g.Open(ctx, k) },
			"Status":     func(k string) error { _, err := g.Status(ctx, k); return err },
			"Do":         func(k string) error { return g.Do(ctx, k, func(context.Context) error { return nil }) },
			"Name":       func(k string) error { _, err := g.Name(k); return err },
		}
		for name, call := range calls {
			if err := call("other"); !errors.Is(err, semgroup.ErrKeyNotAllowed) {
				t.Errorf("%s(other) = %v, want ErrKeyNotAllowed", name, err)
			}
		}
		if n, _ := tr.counts(prefix + "other"); n != 0 {
			t.Fatalf("a refused key was opened %d times", n)
		}
		p, err := g.Acquire(ctx, "ok")
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

func TestNewRejects(t *testing.T) {
	init := func(context.Context, string, int) (tokensem.Semaphore, error) {
		return nil, errors.New("never called")
	}
	for _, tc := range []struct {
		name    string
		init    semgroup.InitFunc
		permits int
		opt     semgroup.Option
		wantErr error
	}{
		{"nil init", nil, 1, nil, tokensem.ErrInvalidOption},
		{"zero permits", init, 0, nil, tokensem.ErrInvalidPermits},
		{"too many permits", init, tokensem.MaxPermits + 1, nil, tokensem.ErrInvalidPermits},
		{"max size 0", init, 1, semgroup.WithMaxSize(0), tokensem.ErrInvalidOption},
		{"empty prefix", init, 1, semgroup.WithPrefix(""), tokensem.ErrInvalidOption},
		{"prefix with a dot", init, 1, semgroup.WithPrefix("a."), tokensem.ErrInvalidOption},
		{"prefix leaves no room", init, 1, semgroup.WithPrefix(strings.Repeat("p", tokensem.MaxNameLen)), tokensem.ErrInvalidOption},
		{"nil permits func", init, 1, semgroup.WithPermitsFunc(nil), tokensem.ErrInvalidOption},
		{"zero open timeout", init, 1, semgroup.WithOpenTimeout(0), tokensem.ErrInvalidOption},
		{"nil logger", init, 1, semgroup.WithLogger(nil), tokensem.ErrInvalidOption},
		{"nil key filter", init, 1, semgroup.WithKeyFilter(nil), tokensem.ErrInvalidOption},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, err := semgroup.New(tc.init, tc.permits, tc.opt)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("New = %v, want %v", err, tc.wantErr)
			}
			if g != nil {
				t.Fatal("New returned a group with an error")
			}
		})
	}
}

// TestClose: waiting callers wake with ErrClosed, later calls fail, held
// permits stay valid and still release.
func TestClose(t *testing.T) {
	forEachBackend(t, func(t *testing.T, init semgroup.InitFunc) {
		tr := track(init)
		prefix := uniquePrefix()
		g, err := semgroup.New(tr.Init, 1, semgroup.WithPrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		ctx := bounded(t)
		held, err := g.Acquire(ctx, "c")
		if err != nil {
			t.Fatal(err)
		}
		waiting := make(chan error, 1)
		go func() {
			_, err := g.Acquire(ctx, "c")
			waiting <- err
		}()
		waitFor(t, "a waiter", func() bool {
			st, err := g.Status(ctx, "c")
			return err == nil && st.Waiting == 1
		})
		if err := g.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-waiting; !errors.Is(err, tokensem.ErrClosed) {
			t.Fatalf("waiting Acquire after Close = %v, want ErrClosed", err)
		}
		if _, closes := tr.counts(prefix + "c"); closes != 1 {
			t.Fatalf("semaphore closed %d times by Close, want 1", closes)
		}
		if _, err := g.Acquire(ctx, "c"); !errors.Is(err, tokensem.ErrClosed) {
			t.Fatalf("Acquire after Close = %v, want ErrClosed", err)
		}
		if err := held.Err(); err != nil {
			t.Fatalf("held permit after Close: %v", err)
		}
		if err := held.Release(ctx); err != nil {
			t.Fatalf("Release after Close: %v", err)
		}
		if err := g.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}

		// The permit went back: a fresh group sees it available.
		g2 := newGroup(t, init, 1, semgroup.WithPrefix(prefix))
		st, err := g2.Status(ctx, "c")
		if err != nil {
			t.Fatal(err)
		}
		if st.Available != 1 {
			t.Fatalf("%d available after release, want 1", st.Available)
		}
	})
}

// TestDoWithFallback sheds load through a group's view of one key.
func TestDoWithFallback(t *testing.T) {
	g := newGroup(t, natsInit(t), 1, semgroup.WithPrefix(uniquePrefix()))
	ctx := bounded(t)
	p, err := g.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release(ctx)
	if p.Key() != "k" {
		t.Fatalf("Key() = %q", p.Key())
	}
	shed := errors.New("shed")
	var got error
	err = g.Do(ctx, "k", func(context.Context) error {
		return errors.New("ran without a permit")
	}, tokensem.WithWait(20*time.Millisecond), tokensem.WithFallback(func(_ context.Context, err error) error {
		got = err
		return shed
	}))
	if err != shed || !errors.Is(got, tokensem.ErrNoPermit) {
		t.Fatalf("Do = %v (fallback got %v), want the fallback's result after ErrNoPermit", err, got)
	}
	if _, err := g.For("k").TryAcquire(ctx); !errors.Is(err, tokensem.ErrNoPermit) {
		t.Fatalf("For(k).TryAcquire = %v, want ErrNoPermit", err)
	}
}

// TestOpen opens a key without taking a permit, once.
func TestOpen(t *testing.T) {
	tr := track(natsInit(t))
	prefix := uniquePrefix()
	g := newGroup(t, tr.Init, 2, semgroup.WithPrefix(prefix))
	ctx := bounded(t)
	for range 2 {
		if err := g.Open(ctx, "o"); err != nil {
			t.Fatal(err)
		}
	}
	if inits, _ := tr.counts(prefix + "o"); inits != 1 || g.Len() != 1 {
		t.Fatalf("%d inits, %d cached after two Opens; want 1, 1", inits, g.Len())
	}
	st, err := g.Status(ctx, "o")
	if err != nil {
		t.Fatal(err)
	}
	if st.Available != 2 || st.Held != 0 {
		t.Fatalf("after Open: %d available, %d held; want 2, 0", st.Available, st.Held)
	}
	if err := g.Open(ctx, "a.b"); !errors.Is(err, tokensem.ErrInvalidName) {
		t.Fatalf("Open(a.b) = %v, want ErrInvalidName", err)
	}
}

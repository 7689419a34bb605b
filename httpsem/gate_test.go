package httpsem_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/httpsem"
	"github.com/tokensem/tokensem/natssem"
	"github.com/tokensem/tokensem/semgroup"
)

type result struct {
	code       int
	retryAfter string
	body       string
	err        error
}

func get(client *http.Client, url string, header ...string) result {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return result{err: err}
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		return result{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return result{code: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), body: string(b), err: err}
}

// TestGateRejectsOverBudget sends 5 concurrent slow requests through a gate
// of 2 permits: the 2 that get a permit run (never more than 2 at once), the
// 3 that get none within the budget are answered 429 with Retry-After, and
// every permit returns afterwards.
func TestGateRejectsOverBudget(t *testing.T) {
	const permits, requests = 2, 5
	sem := newSem(t, connect(t), permits)
	gate, err := httpsem.New(httpsem.Fixed(sem),
		httpsem.WithWait(time.Second), httpsem.WithRetryAfter(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var g gauge
	var rejected atomic.Int64
	release := make(chan struct{})
	slow := gate.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.enter()
		defer g.leave()
		if r.URL.Query().Get("warm") == "" {
			select {
			case <-release:
			case <-r.Context().Done():
				t.Errorf("request context ended: %v", context.Cause(r.Context()))
			}
		}
		_, _ = io.WriteString(w, "ok")
	}))
	ts, client := serve(t, slow)

	// One request first, so that no acquire of the burst is slowed by a
	// cold connection or semaphore.
	if res := get(client, ts.URL+"?warm=1"); res.err != nil || res.code != http.StatusOK {
		t.Fatalf("warm-up request: %+v", res)
	}
	g.total.Store(0)

	results := make(chan result, requests)
	for range requests {
		go func() {
			res := get(client, ts.URL)
			if res.code == http.StatusTooManyRequests {
				rejected.Add(1)
			}
			results <- res
		}()
	}
	// Handlers block until release: every answer before it is a rejection.
	waitFor(t, "every request admitted or rejected", func() bool {
		return g.now.Load()+rejected.Load() == requests
	})
	close(release)
	codes := map[int]int{}
	for range requests {
		res := <-results
		if res.err != nil {
			t.Fatalf("request: %v", res.err)
		}
		codes[res.code]++
		switch res.code {
		case http.StatusOK:
		case http.StatusTooManyRequests:
			if res.retryAfter != "2" {
				t.Errorf("429 with Retry-After %q, want \"2\"", res.retryAfter)
			}
		default:
			t.Errorf("unexpected status %d: %s", res.code, res.body)
		}
	}
	if codes[http.StatusOK] != permits || codes[http.StatusTooManyRequests] != requests-permits {
		t.Fatalf("statuses %v, want %d×200 and %d×429", codes, permits, requests-permits)
	}
	if got := g.total.Load(); got != permits {
		t.Fatalf("%d handlers ran, want %d (a rejected request must not reach the handler)", got, permits)
	}
	if got := g.max.Load(); got != permits {
		t.Fatalf("at most %d handlers ran at once, want exactly %d", got, permits)
	}
	settled(t, sem, permits)
}

// TestGateLostPermitCancelsRequest loses the permit of a running request by
// closing the semaphore's NATS connection: the handler's context ends with
// a cause wrapping ErrLeaseLost, and the permit comes back within its lease.
func TestGateLostPermitCancelsRequest(t *testing.T) {
	nc := connect(t)
	sem := newSem(t, nc, 1, natssem.WithLease(1500*time.Millisecond))
	gate, err := httpsem.New(httpsem.Fixed(sem))
	if err != nil {
		t.Fatal(err)
	}
	entered := make(chan struct{})
	cause := make(chan error, 1)
	ts, client := serve(t, gate.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		select {
		case <-r.Context().Done():
			cause <- context.Cause(r.Context())
		case <-time.After(20 * time.Second):
			cause <- errors.New("the request's context was not cancelled")
		}
		http.Error(w, "permit lost", http.StatusServiceUnavailable)
	})))
	done := make(chan result, 1)
	go func() { done <- get(client, ts.URL) }()
	<-entered
	nc.Close()
	if err := <-cause; !errors.Is(err, tokensem.ErrLeaseLost) {
		t.Fatalf("handler's context cause = %v, want ErrLeaseLost", err)
	}
	if res := <-done; res.err != nil || res.code != http.StatusServiceUnavailable {
		t.Fatalf("response: %+v", res)
	}
	other, err := natssem.Open(bounded(t), connect(t), sem.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	p, err := other.Acquire(bounded(t))
	if err != nil {
		t.Fatalf("the lost permit did not come back: %v", err)
	}
	if err := p.Release(bounded(t)); err != nil {
		t.Fatal(err)
	}
}

// TestGateByKey gates each tenant by its own semaphore of one permit.
func TestGateByKey(t *testing.T) {
	nc := connect(t)
	prefix := uniqueName("tenant") + "-"
	group, err := semgroup.New(func(ctx context.Context, name string, n int) (tokensem.Semaphore, error) {
		return natssem.Init(ctx, nc, name, n)
	}, 1, semgroup.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	defer group.Close()
	gate, err := httpsem.New(httpsem.ByKey(group, httpsem.Header("X-Tenant")), httpsem.WithWait(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	entered := make(chan struct{})
	release := make(chan struct{})
	ts, client := serve(t, gate.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Block") != "" {
			close(entered)
			<-release
		}
		_, _ = io.WriteString(w, "ok "+r.Header.Get("X-Tenant"))
	})))

	blocked := make(chan result, 1)
	go func() { blocked <- get(client, ts.URL, "X-Tenant", "a", "X-Block", "1") }()
	<-entered
	for _, tc := range []struct {
		name   string
		header []string
		want   int
	}{
		{"same tenant waits in vain", []string{"X-Tenant", "a"}, http.StatusTooManyRequests},
		{"another tenant is served", []string{"X-Tenant", "b"}, http.StatusOK},
		{"no tenant", nil, http.StatusBadRequest},
		{"bad tenant", []string{"X-Tenant", "a.b"}, http.StatusBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if res := get(client, ts.URL, tc.header...); res.err != nil || res.code != tc.want {
				t.Fatalf("got %+v, want status %d", res, tc.want)
			}
		})
	}
	close(release)
	if res := <-blocked; res.err != nil || res.code != http.StatusOK || res.body != "ok a" {
		t.Fatalf("blocked request: %+v", res)
	}
	st, err := group.Status(bounded(t), "a")
	if err != nil {
		t.Fatal(err)
	}
	if st.Available != 1 || st.Held != 0 {
		t.Fatalf("tenant a after the requests: %d available, %d held", st.Available, st.Held)
	}
}

// TestGateKeyFilter: a tenant the group's key filter refuses is answered
// 403 before anything reaches the broker, however many distinct ones
// come; an allowed tenant is served.
func TestGateKeyFilter(t *testing.T) {
	nc := connect(t)
	prefix := uniqueName("filtered") + "-"
	var inits atomic.Int64
	group, err := semgroup.New(func(ctx context.Context, name string, n int) (tokensem.Semaphore, error) {
		inits.Add(1)
		return natssem.Init(ctx, nc, name, n)
	}, 1, semgroup.WithPrefix(prefix), semgroup.WithKeyFilter(semgroup.AllowKeys("a", "b")))
	if err != nil {
		t.Fatal(err)
	}
	defer group.Close()
	gate, err := httpsem.New(httpsem.ByKey(group, httpsem.Header("X-Tenant")), httpsem.WithWait(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ts, client := serve(t, gate.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	})))
	for i := range 50 {
		tenant := "t" + strconv.Itoa(i)
		if res := get(client, ts.URL, "X-Tenant", tenant); res.err != nil || res.code != http.StatusForbidden {
			t.Fatalf("tenant %s: got %+v, want status 403", tenant, res)
		}
	}
	if res := get(client, ts.URL, "X-Tenant", "a"); res.err != nil || res.code != http.StatusOK {
		t.Fatalf("tenant a: got %+v, want status 200", res)
	}
	if n := inits.Load(); n != 1 {
		t.Fatalf("%d semaphores made, want 1 (tenant a's)", n)
	}
	infos, err := natssem.List(bounded(t), nc)
	if err != nil {
		t.Fatal(err)
	}
	for _, info := range infos {
		if strings.HasPrefix(info.Name, prefix) && info.Name != prefix+"a" {
			t.Errorf("semaphore %s exists on the broker", info.Name)
		}
	}
}

// TestGateRejectResponse checks the reject handler, the Retry-After
// rounding and a wait budget of 0.
func TestGateRejectResponse(t *testing.T) {
	sem := newSem(t, connect(t), 1)
	p, err := sem.Acquire(bounded(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release(context.Background())
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Error("handler ran without a permit")
	})
	for _, tc := range []struct {
		name       string
		opts       []httpsem.Option
		retryAfter string
		body       string
	}{
		{"default", []httpsem.Option{httpsem.WithWait(0)}, "1", "too many requests\n"},
		{"rounded up", []httpsem.Option{httpsem.WithWait(0), httpsem.WithRetryAfter(2500 * time.Millisecond)}, "3", "too many requests\n"},
		{"zero", []httpsem.Option{httpsem.WithWait(10 * time.Millisecond), httpsem.WithRetryAfter(0)}, "0", "too many requests\n"},
		{"custom", []httpsem.Option{httpsem.WithWait(0), httpsem.WithRejectHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = io.WriteString(w, `{"error":"busy"}`)
		}))}, "1", `{"error":"busy"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gate, err := httpsem.New(httpsem.Fixed(sem), tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			ts, client := serve(t, gate.Wrap(ok))
			res := get(client, ts.URL)
			if res.err != nil || res.code != http.StatusTooManyRequests || res.retryAfter != tc.retryAfter || res.body != tc.body {
				t.Fatalf("got %+v; want 429, Retry-After %q, body %q", res, tc.retryAfter, tc.body)
			}
		})
	}
}

// TestGateErrors: a closed semaphore is 503 by default, and a custom error
// handler sees the error.
func TestGateErrors(t *testing.T) {
	sem := newSem(t, connect(t), 1)
	if err := sem.Close(); err != nil {
		t.Fatal(err)
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Error("handler ran without a permit")
	})
	gate, err := httpsem.New(httpsem.Fixed(sem))
	if err != nil {
		t.Fatal(err)
	}
	ts, client := serve(t, gate.Wrap(handler))
	if res := get(client, ts.URL); res.code != http.StatusServiceUnavailable {
		t.Fatalf("closed semaphore: %+v, want 503", res)
	}

	var seen error
	gate, err = httpsem.New(httpsem.Fixed(sem), httpsem.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) {
		seen = err
		w.WriteHeader(http.StatusTeapot)
	}))
	if err != nil {
		t.Fatal(err)
	}
	ts, client = serve(t, gate.Wrap(handler))
	if res := get(client, ts.URL); res.code != http.StatusTeapot || !errors.Is(seen, tokensem.ErrClosed) {
		t.Fatalf("custom error handler: %+v, saw %v", res, seen)
	}
}

func TestNewRejects(t *testing.T) {
	pick := httpsem.Fixed(nil)
	for _, tc := range []struct {
		name string
		pick httpsem.Picker
		opt  httpsem.Option
	}{
		{"nil picker", nil, nil},
		{"negative wait", pick, httpsem.WithWait(-time.Second)},
		{"negative retry-after", pick, httpsem.WithRetryAfter(-time.Second)},
		{"nil reject handler", pick, httpsem.WithRejectHandler(nil)},
		{"nil error handler", pick, httpsem.WithErrorHandler(nil)},
		{"nil logger", pick, httpsem.WithLogger(nil)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if g, err := httpsem.New(tc.pick, tc.opt); !errors.Is(err, tokensem.ErrInvalidOption) || g != nil {
				t.Fatalf("New = %v, %v; want ErrInvalidOption", g, err)
			}
		})
	}
}

func TestHeader(t *testing.T) {
	key := httpsem.Header("X-Tenant")
	r, _ := http.NewRequest(http.MethodGet, "/", nil)
	if _, err := key(r); !errors.Is(err, httpsem.ErrNoKey) {
		t.Fatalf("missing header: %v, want ErrNoKey", err)
	}
	r.Header.Set("X-Tenant", "42")
	if k, err := key(r); k != "42" || err != nil {
		t.Fatalf("key = %q, %v", k, err)
	}
}

// TestGateByKeySlowOpen: creating a tenant's semaphore takes longer than the
// wait budget, yet its first request is served, not rejected: ByKey opens
// the semaphore before the budget starts.
func TestGateByKeySlowOpen(t *testing.T) {
	nc := connect(t)
	group, err := semgroup.New(func(ctx context.Context, name string, n int) (tokensem.Semaphore, error) {
		time.Sleep(300 * time.Millisecond) // a slow broker, six budgets long
		return natssem.Init(ctx, nc, name, n)
	}, 1, semgroup.WithPrefix(uniqueName("slow")+"-"))
	if err != nil {
		t.Fatal(err)
	}
	defer group.Close()
	gate, err := httpsem.New(httpsem.ByKey(group, httpsem.Header("X-Tenant")), httpsem.WithWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ts, client := serve(t, gate.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	})))
	if res := get(client, ts.URL, "X-Tenant", "new"); res.err != nil || res.code != http.StatusOK {
		t.Fatalf("first request of a new tenant: %+v, want 200", res)
	}
}

// TestGatePriority: with the only permit held, a request of class -2
// waits, then one of class 3 (the class read from a header by
// WithPriority); on release the class-3 request is admitted first.
func TestGatePriority(t *testing.T) {
	sem := newSem(t, connect(t), 1)
	gate, err := httpsem.New(httpsem.Fixed(sem), httpsem.WithWait(30*time.Second),
		httpsem.WithPriority(func(r *http.Request) tokensem.Priority {
			n, _ := strconv.Atoi(r.Header.Get("X-Class"))
			return tokensem.Priority(n)
		}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := httpsem.New(httpsem.Fixed(sem), httpsem.WithPriority(nil)); !errors.Is(err, tokensem.ErrInvalidOption) {
		t.Fatalf("WithPriority(nil): err = %v, want ErrInvalidOption", err)
	}
	admitted := make(chan string, 2)
	ts, client := serve(t, gate.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		admitted <- r.Header.Get("X-Class")
	})))
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	held, err := sem.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	results := make(chan result, 2)
	for i, class := range []string{"-2", "3"} {
		go func() { results <- get(client, ts.URL, "X-Class", class) }()
		for {
			st, err := sem.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if st.Waiting >= i+1 {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("request of class %s never waited", class)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if res := <-results; res.err != nil || res.code != http.StatusOK {
			t.Fatalf("request: %+v", res)
		}
	}
	if first, second := <-admitted, <-admitted; first != "3" || second != "-2" {
		t.Fatalf("admitted classes %s then %s, want 3 then -2", first, second)
	}
}

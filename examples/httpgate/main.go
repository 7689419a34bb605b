package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/httpsem"
	"github.com/tokensem/tokensem/natssem"
	"github.com/tokensem/tokensem/natssem/embedded"
	"github.com/tokensem/tokensem/semgroup"
)

// config is the command line.
type config struct {
	url         string        // NATS server; empty: start an embedded one
	serve       string        // serve on this address until interrupted, no self-demo
	permits     int           // per tenant
	wait        time.Duration // budget for a permit
	retryAfter  time.Duration
	requests    int // self-demo: total requests
	concurrency int // self-demo: requests in flight at once
	tenants     int // tenants "a", "b", ... (the only ones served)
	work        time.Duration
}

func defaultConfig() config {
	return config{
		permits: 2, wait: 100 * time.Millisecond, retryAfter: time.Second,
		requests: 80, concurrency: 16, tenants: 2, work: 50 * time.Millisecond,
	}
}

func main() {
	cfg := defaultConfig()
	flag.StringVar(&cfg.url, "url", "", "NATS server URL (default: start an embedded server)")
	flag.StringVar(&cfg.serve, "serve", "", "serve on this address (host:port) until interrupted instead of the self-demo")
	flag.IntVar(&cfg.permits, "permits", cfg.permits, "requests in the handler at once, per tenant")
	flag.DurationVar(&cfg.wait, "wait", cfg.wait, "how long a request waits for a permit before 429")
	flag.DurationVar(&cfg.retryAfter, "retry-after", cfg.retryAfter, "Retry-After sent with a 429")
	flag.IntVar(&cfg.requests, "requests", cfg.requests, "self-demo: number of requests")
	flag.IntVar(&cfg.concurrency, "concurrency", cfg.concurrency, "self-demo: requests in flight at once")
	flag.IntVar(&cfg.tenants, "tenants", cfg.tenants, "number of tenants (1..26): a, b, ...; any other X-Tenant is answered 403")
	flag.DurationVar(&cfg.work, "work", cfg.work, "time a handler works on a request")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if _, err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "httpgate:", err)
		os.Exit(1)
	}
}

// report is what the self-demo saw.
type report struct {
	Tenants   []tenantReport
	OK        int // 200 answers
	Rejected  int // 429 answers
	MaxActive int // most handlers running at once, all tenants
}

type tenantReport struct {
	Name      string
	OK        int
	Rejected  int
	MaxActive int // most of this tenant's handlers running at once
	Available int // permits available after the load
}

func run(ctx context.Context, cfg config, out io.Writer) (report, error) {
	if cfg.tenants < 1 || cfg.tenants > 26 || cfg.permits < 1 || cfg.concurrency < 1 || cfg.requests < 0 {
		return report{}, errors.New("need 1..26 tenants, and at least 1 permit and 1 concurrent request")
	}
	nc, where, closeNATS, err := connect(cfg.url)
	if err != nil {
		return report{}, err
	}
	defer closeNATS()

	// Tenants come from a request header: only the known ones get a
	// semaphore (any other is answered 403), or every distinct header a
	// client makes up would create one on the broker.
	tenants := make([]string, cfg.tenants)
	for i := range tenants {
		tenants[i] = string(rune('a' + i))
	}
	group, err := semgroup.New(func(ctx context.Context, name string, permits int) (tokensem.Semaphore, error) {
		return natssem.Init(ctx, nc, name, permits)
	}, cfg.permits, semgroup.WithPrefix("httpgate-"), semgroup.WithKeyFilter(semgroup.AllowKeys(tenants...)))
	if err != nil {
		return report{}, err
	}
	defer group.Close()
	gate, err := httpsem.New(httpsem.ByKey(group, httpsem.Header("X-Tenant")),
		httpsem.WithWait(cfg.wait), httpsem.WithRetryAfter(cfg.retryAfter))
	if err != nil {
		return report{}, err
	}
	m := newMeters()
	addr := cfg.serve
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return report{}, err
	}
	srv := &http.Server{Handler: gate.Wrap(m.handler(cfg.work)), ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-served
	}()
	base := "http://" + ln.Addr().String()
	fmt.Fprintf(out, "%s; gate: %d permits per tenant (semaphores httpgate-<tenant>), wait %v, Retry-After %v\n",
		where, cfg.permits, cfg.wait, cfg.retryAfter)

	if cfg.serve != "" {
		fmt.Fprintf(out, "serving on %s until interrupted; try: curl -i -H 'X-Tenant: a' %s/\n", base, base)
		<-ctx.Done()
		return report{}, nil
	}

	fmt.Fprintf(out, "serving on %s; load: %d requests, %d at a time, %d tenants, %v of work each\n\n",
		base, cfg.requests, cfg.concurrency, cfg.tenants, cfg.work)
	answers, err := load(ctx, base, cfg)
	if err != nil {
		return report{}, err
	}
	return summarize(ctx, cfg, group, m, answers, out)
}

// connect connects to url, or to a new embedded server when url is empty.
func connect(url string) (*nats.Conn, string, func(), error) {
	if url != "" {
		nc, err := nats.Connect(url)
		if err != nil {
			return nil, "", nil, err
		}
		return nc, "NATS at " + url, nc.Close, nil
	}
	srv, err := embedded.Start(embedded.Config{})
	if err != nil {
		return nil, "", nil, err
	}
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		srv.Shutdown()
		return nil, "", nil, err
	}
	return nc, "embedded NATS at " + srv.URL(), func() { nc.Close(); srv.Shutdown() }, nil
}

// meters counts the handlers running at once, per tenant and in all.
type meters struct {
	mu                    sync.Mutex
	active, max           map[string]int
	allActive, allMaxSeen int
}

func newMeters() *meters { return &meters{active: map[string]int{}, max: map[string]int{}} }

func (m *meters) enter(tenant string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.active[tenant]++
	m.max[tenant] = max(m.max[tenant], m.active[tenant])
	m.allActive++
	m.allMaxSeen = max(m.allMaxSeen, m.allActive)
}

func (m *meters) leave(tenant string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.active[tenant]--
	m.allActive--
}

// handler is the protected service: it works for work, or stops at once
// when the request's context ends (the permit was lost, or the client left).
func (m *meters) handler(work time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tenant := r.Header.Get("X-Tenant")
		m.enter(tenant)
		defer m.leave(tenant)
		t := time.NewTimer(work)
		defer t.Stop()
		select {
		case <-t.C:
			fmt.Fprintf(w, "done for tenant %s\n", tenant)
		case <-r.Context().Done():
			http.Error(w, "stopped: "+context.Cause(r.Context()).Error(), http.StatusServiceUnavailable)
		}
	})
}

// answer is one response the load generator got.
type answer struct {
	tenant     string
	code       int
	retryAfter string
}

// load sends cfg.requests requests, cfg.concurrency at a time, request i
// for tenant i mod cfg.tenants.
func load(ctx context.Context, base string, cfg config) ([]answer, error) {
	client := &http.Client{
		Transport: &http.Transport{MaxIdleConnsPerHost: cfg.concurrency},
		Timeout:   time.Minute,
	}
	defer client.CloseIdleConnections()
	next := make(chan int)
	answers := make([]answer, cfg.requests)
	errs := make(chan error, cfg.concurrency)
	var wg sync.WaitGroup
	for range cfg.concurrency {
		wg.Go(func() {
			for i := range next {
				tenant := string(rune('a' + i%cfg.tenants))
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/", nil)
				if err != nil {
					errs <- err
					return
				}
				req.Header.Set("X-Tenant", tenant)
				resp, err := client.Do(req)
				if err != nil {
					errs <- err
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				answers[i] = answer{tenant: tenant, code: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After")}
			}
		})
	}
	var err error
feed:
	for i := range cfg.requests {
		select {
		case next <- i:
		case err = <-errs:
			break feed
		}
	}
	close(next)
	wg.Wait()
	close(errs)
	if err == nil {
		err = <-errs // nil once closed and empty
	}
	return answers, err
}

// summarize prints the report and checks the claims: no tenant above its
// permits, every rejection with Retry-After, every permit back.
func summarize(ctx context.Context, cfg config, group *semgroup.Group, m *meters, answers []answer, out io.Writer) (report, error) {
	var rep report
	byTenant := map[string]*tenantReport{}
	var problems []error
	for _, a := range answers {
		t := byTenant[a.tenant]
		if t == nil {
			t = &tenantReport{Name: a.tenant}
			byTenant[a.tenant] = t
		}
		switch a.code {
		case http.StatusOK:
			t.OK++
			rep.OK++
		case http.StatusTooManyRequests:
			t.Rejected++
			rep.Rejected++
			if a.retryAfter == "" {
				problems = append(problems, fmt.Errorf("tenant %s: a 429 without Retry-After", a.tenant))
			}
		default:
			problems = append(problems, fmt.Errorf("tenant %s: unexpected status %d", a.tenant, a.code))
		}
	}
	m.mu.Lock()
	rep.MaxActive = m.allMaxSeen
	for name, t := range byTenant {
		t.MaxActive = m.max[name]
	}
	m.mu.Unlock()

	names := make([]string, 0, len(byTenant))
	for name := range byTenant {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		t := byTenant[name]
		available, err := settle(ctx, group, name, cfg.permits)
		if err != nil {
			return report{}, err
		}
		t.Available = available
		fmt.Fprintf(out, "tenant %s: %3d × 200, %3d × 429 (Retry-After %s); most at once: %d of %d permits; after: %d of %d available\n",
			name, t.OK, t.Rejected, answerRetryAfter(answers, name), t.MaxActive, cfg.permits, available, cfg.permits)
		if t.MaxActive > cfg.permits {
			problems = append(problems, fmt.Errorf("SAFETY VIOLATION: tenant %s had %d handlers at once, %d permits", name, t.MaxActive, cfg.permits))
		}
		if available != cfg.permits {
			problems = append(problems, fmt.Errorf("tenant %s: %d of %d permits came back", name, available, cfg.permits))
		}
		rep.Tenants = append(rep.Tenants, *t)
	}
	fmt.Fprintf(out, "\ntotal: %d × 200, %d × 429; most handlers at once: %d (limit %d tenants × %d permits)\n",
		rep.OK, rep.Rejected, rep.MaxActive, len(byTenant), cfg.permits)
	return rep, errors.Join(problems...)
}

// settle waits (up to 5 s) for every permit of tenant to be available
// again: a released token is handed back asynchronously.
func settle(ctx context.Context, group *semgroup.Group, tenant string, permits int) (int, error) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := group.Status(ctx, tenant)
		if err != nil {
			return 0, err
		}
		if st.Available == permits || time.Now().After(deadline) {
			return st.Available, nil
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func answerRetryAfter(answers []answer, tenant string) string {
	for _, a := range answers {
		if a.tenant == tenant && a.code == http.StatusTooManyRequests {
			return a.retryAfter + "s"
		}
	}
	return "-"
}

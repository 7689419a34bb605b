package semmetrics

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/adaptive"
	"github.com/tokensem/tokensem/amqpsem"
	"github.com/tokensem/tokensem/driver"
	"github.com/tokensem/tokensem/internal/rabbittest"
	"github.com/tokensem/tokensem/internal/semtest"
	"github.com/tokensem/tokensem/internal/testenv"
	"github.com/tokensem/tokensem/natssem"
	"github.com/tokensem/tokensem/natssem/embedded"
	"github.com/tokensem/tokensem/reconciler"
)

var srv *embedded.Server

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, testenv.NATS, func(b testenv.Brokers) { srv = b.NATS }))
}

func connect(t *testing.T) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func bounded(t *testing.T) context.Context { return semtest.Context(t, 30*time.Second) }

// TestPermitMetrics drives a real semaphore through every outcome and
// reads the metrics back.
func TestPermitMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := New(reg)
	if err != nil {
		t.Fatal(err)
	}
	const name = "metrics"
	sem, err := natssem.Init(bounded(t), connect(t), name, 2,
		natssem.WithLease(tokensem.MinLease), natssem.WithObserver(m))
	if err != nil {
		t.Fatal(err)
	}
	defer sem.Close()

	p1, err := sem.Acquire(bounded(t))
	if err != nil {
		t.Fatal(err)
	}
	p2, err := sem.Acquire(bounded(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sem.TryAcquire(bounded(t)); !errors.Is(err, tokensem.ErrNoPermit) {
		t.Fatalf("TryAcquire with both held: %v", err)
	}
	short, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	_, err = sem.Acquire(short)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire with both held: %v", err)
	}
	if err := p1.Release(bounded(t)); err != nil {
		t.Fatal(err)
	}

	// A second client whose connection dies loses its permit.
	nc2 := connect(t)
	sem2, err := natssem.Open(bounded(t), nc2, name, natssem.WithObserver(m))
	if err != nil {
		t.Fatal(err)
	}
	defer sem2.Close()
	p3, err := sem2.Acquire(bounded(t))
	if err != nil {
		t.Fatal(err)
	}
	nc2.Close()
	select {
	case <-p3.Done():
	case <-bounded(t).Done():
		t.Fatal("the permit of a closed connection was never lost")
	}
	if !errors.Is(p3.Err(), tokensem.ErrLeaseLost) {
		t.Fatalf("p3: %v", p3.Err())
	}
	// Done closes first (a holder must learn of a loss at once); the
	// observer hears of it right after.
	for testutil.ToFloat64(m.lost.WithLabelValues(name)) == 0 {
		select {
		case <-bounded(t).Done():
			t.Fatal("the loss was never counted")
		case <-time.After(5 * time.Millisecond):
		}
	}
	// p2 renews every lease/3.
	for testutil.ToFloat64(m.renewals.WithLabelValues(name, "ok")) == 0 {
		select {
		case <-bounded(t).Done():
			t.Fatal("no renewal counted")
		case <-time.After(20 * time.Millisecond):
		}
	}

	for _, c := range []struct {
		what string
		c    prometheus.Collector
		want float64
	}{
		{"acquired", m.acquisitions.WithLabelValues(name, "acquired"), 3},
		{"no_permit", m.acquisitions.WithLabelValues(name, "no_permit"), 1},
		{"timeout", m.acquisitions.WithLabelValues(name, "timeout"), 1},
		{"held now (p2)", m.held.WithLabelValues(name), 1},
		{"permits", m.permits.WithLabelValues(name), 2},
		{"lost", m.lost.WithLabelValues(name), 1},
	} {
		if got := testutil.ToFloat64(c.c); got != c.want {
			t.Errorf("%s = %v, want %v", c.what, got, c.want)
		}
	}
	if n := testutil.CollectAndCount(m.wait); n != 3 { // one series per outcome
		t.Errorf("%d wait series, want 3", n)
	}
	if err := p2.Release(bounded(t)); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(m.held.WithLabelValues(name)); got != 0 {
		t.Errorf("held after every release = %v", got)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %+v", err, problems)
	}
}

// TestReconcileMetrics: a run's findings and repairs.
func TestReconcileMetrics(t *testing.T) {
	m, err := New(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	nc := connect(t)
	const name = "metrics-reconcile"
	sem, err := natssem.Init(bounded(t), nc, name, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer sem.Close()
	if err := nc.Publish(natssem.ResourcesOf(name, "").Subject, []byte("junk")); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// The junk is a core NATS publish: wait until the stream has it.
	var r reconciler.Report
	for r.Invalid == 0 {
		r, err = reconciler.Run(bounded(t), sem.Inventory(), false)
		m.ObserveReport(name, r, err)
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := testutil.ToFloat64(m.findings.WithLabelValues(name, "invalid")); got != 1 {
		t.Errorf("invalid finding = %v", got)
	}
	r, err = reconciler.Run(bounded(t), sem.Inventory(), true)
	m.ObserveReport(name, r, err)
	if err != nil || !r.Healthy {
		t.Fatalf("repair: %+v %v", r, err)
	}
	if got := testutil.ToFloat64(m.repairs.WithLabelValues(name, "removed")); got != 1 {
		t.Errorf("removed = %v", got)
	}
	if got := testutil.ToFloat64(m.runs.WithLabelValues(name, "healthy")); got != 1 {
		t.Errorf("healthy runs = %v", got)
	}
	if got := testutil.ToFloat64(m.tokens.WithLabelValues(name)); got != 4 {
		t.Errorf("tokens = %v, want 4 (the census before the repair)", got)
	}
	m.ObserveReport(name, reconciler.Report{}, errors.New("broker gone"))
	if got := testutil.ToFloat64(m.runs.WithLabelValues(name, "error")); got != 1 {
		t.Errorf("error runs = %v", got)
	}
}

func TestNewValidates(t *testing.T) {
	if _, err := New(nil); !errors.Is(err, tokensem.ErrInvalidOption) {
		t.Errorf("nil registerer: %v", err)
	}
	if _, err := New(prometheus.NewRegistry(), WithWaitBuckets([]float64{1, 1})); !errors.Is(err, tokensem.ErrInvalidOption) {
		t.Errorf("bad buckets: %v", err)
	}
	reg := prometheus.NewRegistry()
	if _, err := New(reg); err != nil {
		t.Fatal(err)
	}
	if _, err := New(reg); err == nil {
		t.Error("registering twice succeeded")
	}
	if _, err := New(reg, WithNamespace("other")); err != nil {
		t.Errorf("a second namespace: %v", err)
	}
}

// TestAMQPMetrics: the RabbitMQ backend reports through the same Observer.
func TestAMQPMetrics(t *testing.T) {
	b := rabbittest.Need(t)
	c, err := amqpsem.Dial(bounded(t), b.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m, err := New(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	name := "metrics-" + driver.NewToken("x", 0, 0).ID[:8]
	sem, err := amqpsem.Init(bounded(t), c, name, 1, amqpsem.WithObserver(m))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { // the broker outlives the run
		_ = sem.Close()
		if err := amqpsem.ForceDelete(bounded(t), c, name); err != nil {
			t.Errorf("deleting %s: %v", name, err)
		}
	}()
	p, err := sem.Acquire(bounded(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sem.TryAcquire(bounded(t)); !errors.Is(err, tokensem.ErrNoPermit) {
		t.Fatalf("TryAcquire: %v", err)
	}
	if got := testutil.ToFloat64(m.held.WithLabelValues(name)); got != 1 {
		t.Errorf("held = %v, want 1", got)
	}
	if err := p.Release(bounded(t)); err != nil {
		t.Fatal(err)
	}
	for what, want := range map[string]float64{"acquired": 1, "no_permit": 1} {
		if got := testutil.ToFloat64(m.acquisitions.WithLabelValues(name, what)); got != want {
			t.Errorf("%s = %v, want %v", what, got, want)
		}
	}
	if got := testutil.ToFloat64(m.held.WithLabelValues(name)); got != 0 {
		t.Errorf("held after release = %v", got)
	}
}

// TestCountMetrics: a Count of a semaphore with one of its 4 permits held
// elsewhere shows as 3 available, 1 held, utilization 0.25.
func TestCountMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := New(reg)
	if err != nil {
		t.Fatal(err)
	}
	const name = "metrics-count"
	sem, err := natssem.Init(bounded(t), connect(t), name, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer sem.Close()
	p, err := sem.Acquire(bounded(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release(context.Background())
	c, err := sem.Count(bounded(t))
	if err != nil {
		t.Fatal(err)
	}
	m.ObserveCount(name, c)
	for _, want := range []struct {
		state string
		v     float64
	}{{"available", 3}, {"held", 1}, {"waiting", 0}} {
		if got := testutil.ToFloat64(m.usage.WithLabelValues(name, want.state)); got != want.v {
			t.Errorf("%s = %v, want %v", want.state, got, want.v)
		}
	}
	if got := testutil.ToFloat64(m.utilization.WithLabelValues(name)); got != 0.25 {
		t.Errorf("utilization = %v, want 0.25", got)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}

// TestDecisionMetrics: an adaptive controller's decisions set the count,
// the latency and busy permits it decided on, and count by result.
func TestDecisionMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := New(reg)
	if err != nil {
		t.Fatal(err)
	}
	const name = "metrics-adaptive"
	s := adaptive.Sample{Busy: 5.5, RTT: 40 * time.Millisecond, Holds: 100}
	m.ObserveDecision(name, adaptive.Decision{From: 6, To: 8, Permits: 8, Sample: s})
	m.ObserveDecision(name, adaptive.Decision{From: 8, To: 8, Permits: 8, Sample: s})
	m.ObserveDecision(name, adaptive.Decision{From: 8, To: 5, Permits: 8, Sample: s, Err: errors.New("resize refused")})
	if got := testutil.ToFloat64(m.permits.WithLabelValues(name)); got != 8 {
		t.Errorf("permits = %v after 6→8, 8 kept, and 8→5 failed with 8 read back; want 8", got)
	}
	if got := testutil.ToFloat64(m.latency.WithLabelValues(name)); got != 0.04 {
		t.Errorf("latency = %v, want 0.04", got)
	}
	if got := testutil.ToFloat64(m.busy.WithLabelValues(name)); got != 5.5 {
		t.Errorf("busy = %v, want 5.5", got)
	}
	for result, want := range map[string]float64{"raised": 1, "kept": 1, "failed": 1, "lowered": 0} {
		if got := testutil.ToFloat64(m.decisions.WithLabelValues(name, result)); got != want {
			t.Errorf("decisions %s = %v, want %v", result, got, want)
		}
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}

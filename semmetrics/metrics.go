package semmetrics

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/adaptive"
	"github.com/tokensem/tokensem/reconciler"
)

// DefaultWaitBuckets are the acquire-wait histogram's buckets, in seconds:
// 100 µs to about 2 minutes.
var DefaultWaitBuckets = prometheus.ExponentialBuckets(0.0001, 4, 11)

// Metrics holds the collectors. Safe for concurrent use.
type Metrics struct {
	permits      *prometheus.GaugeVec
	held         *prometheus.GaugeVec
	wait         *prometheus.HistogramVec
	acquisitions *prometheus.CounterVec
	holds        *prometheus.HistogramVec
	renewals     *prometheus.CounterVec
	lost         *prometheus.CounterVec

	runs     *prometheus.CounterVec
	tokens   *prometheus.GaugeVec
	findings *prometheus.GaugeVec
	repairs  *prometheus.CounterVec

	usage       *prometheus.GaugeVec
	utilization *prometheus.GaugeVec

	latency   *prometheus.GaugeVec
	busy      *prometheus.GaugeVec
	decisions *prometheus.CounterVec
}

var _ tokensem.Observer = (*Metrics)(nil)

// Option configures New.
type Option func(*settings) error

type settings struct {
	namespace   string
	waitBuckets []float64
}

// WithNamespace sets the metric name prefix (default "tokensem").
func WithNamespace(ns string) Option {
	return func(s *settings) error {
		if ns == "" {
			return fmt.Errorf("%w: empty metrics namespace", tokensem.ErrInvalidOption)
		}
		s.namespace = ns
		return nil
	}
}

// WithWaitBuckets sets the acquire-wait histogram's buckets, in seconds,
// increasing (default DefaultWaitBuckets).
func WithWaitBuckets(b []float64) Option {
	return func(s *settings) error {
		if len(b) == 0 {
			return fmt.Errorf("%w: no wait buckets", tokensem.ErrInvalidOption)
		}
		for i := 1; i < len(b); i++ {
			if b[i] <= b[i-1] {
				return fmt.Errorf("%w: wait buckets must increase", tokensem.ErrInvalidOption)
			}
		}
		s.waitBuckets = append([]float64(nil), b...)
		return nil
	}
}

// New creates the metrics and registers them with reg. It fails if reg is
// nil or already holds metrics of the same names (use WithNamespace, or
// share one Metrics between semaphores: it labels by semaphore).
func New(reg prometheus.Registerer, opts ...Option) (*Metrics, error) {
	if reg == nil {
		return nil, fmt.Errorf("%w: nil registerer", tokensem.ErrInvalidOption)
	}
	s := settings{namespace: "tokensem", waitBuckets: DefaultWaitBuckets}
	for _, o := range opts {
		if err := o(&s); err != nil {
			return nil, err
		}
	}
	ns := s.namespace
	sem := []string{"semaphore"}
	m := &Metrics{
		permits: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "permits",
			Help: "The semaphore's number of permits (N), as this client last saw it."}, sem),
		held: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "permits_held",
			Help: "Permits this process holds now."}, sem),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "acquire_wait_seconds",
			Help: "Time spent in Acquire or TryAcquire, by outcome.", Buckets: s.waitBuckets},
			[]string{"semaphore", "outcome"}),
		acquisitions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "acquisitions_total",
			Help: "Acquire and TryAcquire calls by outcome: acquired, timeout, no_permit, error."},
			[]string{"semaphore", "outcome"}),
		holds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "hold_seconds",
			Help: "How long permits were held, by end: released or lost.", Buckets: s.waitBuckets},
			[]string{"semaphore", "end"}),
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "renewals_total",
			Help: "Lease renewals by result: ok or error (retried until the lease runs out)."},
			[]string{"semaphore", "result"}),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "permits_lost_total",
			Help: "Held permits lost (lease expired, connection dropped, taken over)."}, sem),

		runs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "reconcile_runs_total",
			Help: "Reconciler runs by result: healthy, unhealthy (after the run) or error."},
			[]string{"semaphore", "result"}),
		tokens: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "reconcile_tokens",
			Help: "Token messages the latest reconciler census found."}, sem),
		findings: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "reconcile_findings",
			Help: "What the latest reconciler census found wrong, by kind: duplicates, missing, invalid."},
			[]string{"semaphore", "kind"}),
		repairs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "reconcile_repairs_total",
			Help: "Reconciler repairs by action: removed (messages) or issued (tokens)."},
			[]string{"semaphore", "action"}),

		usage: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "semaphore_permits",
			Help: "The semaphore's permits across all its clients, from the latest tokensem.Count, by state: available, held, waiting (callers blocked in Acquire)."},
			[]string{"semaphore", "state"}),
		utilization: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "semaphore_utilization",
			Help: "Held permits over permits across all the semaphore's clients, from the latest tokensem.Count."}, sem),

		latency: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "adaptive_latency_seconds",
			Help: "The mean use of a permit over the adaptive controller's latest window, as the fleet reported it: the latency the controller follows."}, sem),
		busy: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "adaptive_busy_permits",
			Help: "Permits the fleet held on average over the adaptive controller's latest window."}, sem),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "adaptive_decisions_total",
			Help: "The adaptive controller's decisions by result: raised, lowered, kept (the count), failed (a resize that failed: the count stayed)."},
			[]string{"semaphore", "result"}),
	}
	for _, c := range []prometheus.Collector{m.permits, m.held, m.wait, m.acquisitions, m.holds,
		m.renewals, m.lost, m.runs, m.tokens, m.findings, m.repairs, m.usage, m.utilization,
		m.latency, m.busy, m.decisions} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("semmetrics: register: %w", err)
		}
	}
	return m, nil
}

// Observe records one event; it implements tokensem.Observer.
func (m *Metrics) Observe(e tokensem.Event) {
	if e.Permits > 0 {
		m.permits.WithLabelValues(e.Semaphore).Set(float64(e.Permits))
	}
	switch e.Kind {
	case tokensem.EventAcquire:
		out := string(e.Outcome)
		m.acquisitions.WithLabelValues(e.Semaphore, out).Inc()
		m.wait.WithLabelValues(e.Semaphore, out).Observe(e.Wait.Seconds())
		if e.Outcome == tokensem.OutcomeAcquired {
			m.held.WithLabelValues(e.Semaphore).Inc()
		}
	case tokensem.EventRelease:
		m.held.WithLabelValues(e.Semaphore).Dec()
		m.holds.WithLabelValues(e.Semaphore, "released").Observe(e.Held.Seconds())
	case tokensem.EventLost:
		m.held.WithLabelValues(e.Semaphore).Dec()
		m.lost.WithLabelValues(e.Semaphore).Inc()
		m.holds.WithLabelValues(e.Semaphore, "lost").Observe(e.Held.Seconds())
	case tokensem.EventRenew:
		result := "ok"
		if e.Err != nil {
			result = "error"
		}
		m.renewals.WithLabelValues(e.Semaphore, result).Inc()
	}
}

// ObserveReport records one reconciler run of semaphore name: its result,
// the census's findings and the repairs. A run that failed (err) counts as
// an error and leaves the findings of the previous run.
func (m *Metrics) ObserveReport(name string, r reconciler.Report, err error) {
	switch {
	case err != nil:
		m.runs.WithLabelValues(name, "error").Inc()
		return
	case r.Healthy:
		m.runs.WithLabelValues(name, "healthy").Inc()
	default:
		m.runs.WithLabelValues(name, "unhealthy").Inc()
	}
	if r.Permits > 0 {
		m.permits.WithLabelValues(name).Set(float64(r.Permits))
	}
	m.tokens.WithLabelValues(name).Set(float64(r.Tokens))
	m.findings.WithLabelValues(name, "duplicates").Set(float64(len(r.Duplicates)))
	m.findings.WithLabelValues(name, "missing").Set(float64(len(r.Missing)))
	m.findings.WithLabelValues(name, "invalid").Set(float64(r.Invalid))
	m.repairs.WithLabelValues(name, "removed").Add(float64(r.Removed))
	m.repairs.WithLabelValues(name, "issued").Add(float64(r.Issued))
}

// ObserveCount records a cheap reading of semaphore name's use by all its
// clients (tokensem.Counter): available, held and waiting permits and the
// utilization, held over permits. `seminit reconcile --watch` takes one
// after every run.
func (m *Metrics) ObserveCount(name string, c tokensem.Count) {
	if c.Permits > 0 {
		m.permits.WithLabelValues(name).Set(float64(c.Permits))
		m.utilization.WithLabelValues(name).Set(float64(c.Held) / float64(c.Permits))
	}
	m.usage.WithLabelValues(name, "available").Set(float64(c.Available))
	m.usage.WithLabelValues(name, "held").Set(float64(c.Held))
	m.usage.WithLabelValues(name, "waiting").Set(float64(c.Waiting))
}

// ObserveDecision records one decision of the adaptive controller of
// semaphore name (adaptive.Controller's Decided): the count after it
// (tokensem_permits, Decision.Permits), the latency and busy permits it
// decided on, and the decision's result.
func (m *Metrics) ObserveDecision(name string, d adaptive.Decision) {
	result := "kept"
	switch {
	case d.Err != nil:
		result = "failed"
	case d.To > d.From:
		result = "raised"
	case d.To < d.From:
		result = "lowered"
	}
	m.decisions.WithLabelValues(name, result).Inc()
	if d.Permits > 0 {
		m.permits.WithLabelValues(name).Set(float64(d.Permits))
	}
	if d.Sample.Holds > 0 { // a window of levels only has no latency
		m.latency.WithLabelValues(name).Set(d.Sample.RTT.Seconds())
	}
	m.busy.WithLabelValues(name).Set(d.Sample.Busy)
}

// Package semmetrics exports tokensem's events as Prometheus metrics.
//
// A Metrics is a tokensem.Observer: give it to a semaphore with the
// backend's WithObserver option, and it counts this process's
// acquisitions by outcome, the time callers waited, permits held now and
// the semaphore's size (utilization is held / permits), renewals and lost
// permits. ObserveReport adds a reconciler's findings and repairs, for
// `seminit reconcile --watch` or a program running reconciler.Watch;
// ObserveDecision an adaptive controller's count, and the latency it
// follows, for `seminit adapt` or a program running adaptive.Controller.
//
// Every metric has a "semaphore" label. A process that opens very many
// semaphores (semgroup with a key per tenant) makes one series per
// semaphore and metric; keep that in mind for the cardinality of your
// Prometheus.
//
//	m, err := semmetrics.New(prometheus.DefaultRegisterer)
//	sem, err := natssem.Open(ctx, nc, "api", natssem.WithObserver(m))
package semmetrics

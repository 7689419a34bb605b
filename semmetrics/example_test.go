package semmetrics_test

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokensem/tokensem/natssem"
	"github.com/tokensem/tokensem/natssem/embedded"
	"github.com/tokensem/tokensem/semmetrics"
)

// Example counts a semaphore's acquisitions into a Prometheus registry
// (serve it with promhttp.HandlerFor).
func Example() {
	srv, err := embedded.Start(embedded.Config{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Shutdown()
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer nc.Close()

	reg := prometheus.NewRegistry()
	m, err := semmetrics.New(reg)
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	sem, err := natssem.Init(ctx, nc, "api", 1, natssem.WithObserver(m))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sem.Close()
	p, _ := sem.Acquire(ctx)
	_, _ = sem.TryAcquire(ctx) // none free
	_ = p.Release(ctx)

	families, _ := reg.Gather()
	for _, f := range families {
		if f.GetName() != "tokensem_acquisitions_total" {
			continue
		}
		for _, s := range f.GetMetric() {
			fmt.Println(s.GetLabel()[0].GetValue(), s.GetCounter().GetValue())
		}
	}
	// Output:
	// acquired 1
	// no_permit 1
}

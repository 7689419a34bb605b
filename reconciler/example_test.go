package reconciler_test

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokensem/tokensem/natssem"
	"github.com/tokensem/tokensem/natssem/embedded"
	"github.com/tokensem/tokensem/reconciler"
)

// ExampleRun finds a junk message in a semaphore's stream and removes it.
func ExampleRun() {
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
	ctx := context.Background()
	sem, err := natssem.Init(ctx, nc, "orders", 3)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sem.Close()
	_, _ = nc.Request(natssem.ResourcesOf("orders", "").Subject, []byte("not a token"), time.Second) // JetStream acks it

	report, err := reconciler.Run(ctx, sem.Inventory(), false)
	fmt.Println("report only:", report.Invalid, "invalid, healthy:", report.Healthy, err)
	report, err = reconciler.Run(ctx, sem.Inventory(), true)
	fmt.Println("repair:", report.Removed, "removed, healthy:", report.Healthy, err)
	// Output:
	// report only: 1 invalid, healthy: false <nil>
	// repair: 1 removed, healthy: true <nil>
}

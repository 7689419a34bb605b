package natssem_test

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/natssem"
	"github.com/tokensem/tokensem/natssem/embedded"
)

// Example runs a semaphore of 2 permits on an in-process NATS server: two
// holders at once, a third caller finds none free, and Do runs a function
// under a permit.
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

	ctx := context.Background()
	sem, err := natssem.Init(ctx, nc, "gpu-pool", 2) // idempotent; Open needs only the name
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sem.Close()

	a, _ := sem.Acquire(ctx)
	b, _ := sem.Acquire(ctx)
	_, err = sem.TryAcquire(ctx)
	fmt.Println("third caller:", err)
	_ = a.Release(ctx)
	_ = b.Release(ctx)

	err = tokensem.Do(ctx, sem, func(ctx context.Context) error {
		fmt.Println("working under a permit") // ctx ends if the permit is lost
		return nil
	})
	fmt.Println("done:", err)
	// Output:
	// third caller: tokensem: no permit available
	// working under a permit
	// done: <nil>
}

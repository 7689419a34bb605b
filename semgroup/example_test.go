package semgroup_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/natssem"
	"github.com/tokensem/tokensem/natssem/embedded"
	"github.com/tokensem/tokensem/semgroup"
)

// Example keeps one semaphore per tenant on an in-process NATS server:
// 2 permits each, 5 for the tenant "big", created on first use.
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

	group, err := semgroup.New(func(ctx context.Context, name string, permits int) (tokensem.Semaphore, error) {
		return natssem.Init(ctx, nc, name, permits)
	}, 2,
		semgroup.WithPrefix("tenant-"),
		semgroup.WithPermitsFunc(func(key string) int {
			if key == "big" {
				return 5
			}
			return 0 // the default, 2
		}),
		semgroup.WithMaxSize(1000))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer group.Close()

	ctx := context.Background()
	a, _ := group.Acquire(ctx, "42")
	b, _ := group.Acquire(ctx, "42")
	_, err = group.TryAcquire(ctx, "42")
	fmt.Println("third permit of tenant 42:", err)

	err = group.Do(ctx, "7", func(ctx context.Context) error {
		fmt.Println("tenant 7 is not held up by tenant 42")
		return nil
	})
	fmt.Println("done:", err)
	_ = a.Release(ctx)
	_ = b.Release(ctx)

	for _, key := range []string{"42", "big"} {
		st, _ := group.Status(ctx, key)
		fmt.Printf("%s: %d permits, %d available\n", st.Name, st.Permits, st.Available)
	}
	_, err = group.Acquire(ctx, "a.b")
	fmt.Println("bad key:", errors.Is(err, tokensem.ErrInvalidName))
	// Output:
	// third permit of tenant 42: tokensem: no permit available
	// tenant 7 is not held up by tenant 42
	// done: <nil>
	// tenant-42: 2 permits, 2 available
	// tenant-big: 5 permits, 5 available
	// bad key: true
}

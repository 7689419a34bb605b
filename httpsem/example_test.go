package httpsem_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokensem/tokensem/httpsem"
	"github.com/tokensem/tokensem/natssem"
	"github.com/tokensem/tokensem/natssem/embedded"
)

// Example puts a gate of one permit in front of a handler: while the permit
// is held elsewhere, a request waits 50ms and is then answered 429 with
// Retry-After; once it is free, the request is served.
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
	sem, err := natssem.Init(ctx, nc, "render", 1)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sem.Close()

	gate, err := httpsem.New(httpsem.Fixed(sem),
		httpsem.WithWait(50*time.Millisecond),
		httpsem.WithRetryAfter(2*time.Second))
	if err != nil {
		fmt.Println(err)
		return
	}
	ts := httptest.NewServer(gate.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "rendered\n") // r.Context() ends if the permit is lost
	})))
	defer ts.Close()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	show := func() {
		resp, err := client.Get(ts.URL)
		if err != nil {
			fmt.Println(err)
			return
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		fmt.Printf("%d Retry-After=%q %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}

	p, _ := sem.Acquire(ctx) // someone else holds the only permit
	show()
	_ = p.Release(ctx)
	show()
	// Output:
	// 429 Retry-After="2" too many requests
	// 200 Retry-After="" rendered
}

// Command httpgate puts an HTTP service behind per-tenant distributed
// semaphores (package httpsem with a semgroup.Group): each tenant, named by
// the X-Tenant header, may have at most -permits requests in its handler at
// once across every replica; a request that gets no permit within -wait is
// answered 429 Too Many Requests with a Retry-After header. Only the
// -tenants tenants a, b, ... are served: any other X-Tenant is answered 403
// Forbidden and creates nothing on the broker (semgroup.WithKeyFilter).
//
//	go run ./examples/httpgate                        # embedded NATS, built-in load, a report
//	go run ./examples/httpgate -serve 127.0.0.1:8080  # just serve; try it with curl:
//	curl -i -H 'X-Tenant: a' http://127.0.0.1:8080/
//
// Without -url it starts an embedded NATS JetStream server; with -url it
// uses the NATS server there. By default it runs a short self-demo: a load
// generator sends -requests requests, -concurrency at a time, spread over
// -tenants tenants, to handlers that work for -work each, and prints per
// tenant how many got 200 and how many 429, and the most handlers that ran
// at once (counted in the handler, never above -permits per tenant). It
// exits 1 if a claim fails: a tenant above its permits, a 429 without
// Retry-After, or a permit not returned.
package main

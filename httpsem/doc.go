// Package httpsem is net/http middleware that admits a request only while
// it holds a permit of a distributed semaphore, so that at most N requests
// run at once across every replica of a service. A request that gets no
// permit within its wait budget is answered 429 Too Many Requests with a
// Retry-After header instead of queueing without bound.
//
//	gate, err := httpsem.New(httpsem.Fixed(sem), httpsem.WithWait(200*time.Millisecond))
//	...
//	http.ListenAndServe(addr, gate.Wrap(handler))
//
// Per tenant, with a semgroup.Group keyed by a request header:
//
//	gate, err := httpsem.New(httpsem.ByKey(group, httpsem.Header("X-Tenant")))
//
// # Contract
//
// For each request the gate picks a semaphore (Picker) and acquires a
// permit, waiting at most the budget set by WithWait (and never past the
// request's context). With a permit, it calls the next handler with a
// request whose context is cancelled if the permit is lost mid-request
// (context.Cause then wraps tokensem.ErrLeaseLost): the handler should stop
// touching the protected resource at once. The permit is released when the
// handler returns, before the response is complete. Without a permit in
// time, the next handler is not called: the gate sets Retry-After and calls
// the reject handler (default: 429 and a short text body). Any other
// failure — the picker's error, a closed semaphore, a broker error — goes to
// the error handler (default: 400 for a request without a valid key, 503
// otherwise). The gate is tokensem.Do with WithWait and WithFallback.
package httpsem

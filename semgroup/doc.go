// Package semgroup keeps one distributed semaphore per key — a tenant, a
// customer, an upstream host — opening each on first use and creating it
// idempotently with its configured number of permits. It is broker
// neutral: a caller-supplied InitFunc creates or opens the semaphore, so
// natssem.Init and amqpsem.Init fit with a one-line closure.
//
//	g, err := semgroup.New(func(ctx context.Context, name string, n int) (tokensem.Semaphore, error) {
//		return natssem.Init(ctx, nc, name, n)
//	}, 5, semgroup.WithPrefix("tenant-"))
//	...
//	err = g.Do(ctx, "42", func(ctx context.Context) error { ... }) // semaphore "tenant-42", 5 permits
//
// # Contract
//
// Keys: a key maps to the semaphore name prefix+key, which must pass
// tokensem.ValidateName; an empty key or one that does not is refused with an error
// wrapping tokensem.ErrInvalidName before any broker call.
//
// Untrusted keys: every new key creates a semaphore on the broker (a
// stream and a bucket, or queues), so keys taken from requests or
// messages should pass WithKeyFilter (AllowKeys for a known set): a
// refused key fails with ErrKeyNotAllowed before any broker call. Bound
// what is left on the broker side too (JetStream account limits on
// streams, RabbitMQ user limits on queues) and expire unused keys
// (WithIdleExpiry).
//
// Once per key: concurrent first uses of one key call the InitFunc once and
// share its outcome. The call runs on the group's own context (bounded by
// WithOpenTimeout, cancelled by Close), so a caller that gives up does not
// abort an open others wait for. Opening one key never blocks the use of
// another: no lock is held across a broker call. A failed open is not
// remembered: the next use of the key tries again. Init's errors are
// returned unchanged, so errors.Is finds tokensem.ErrPermitMismatch when the
// broker already has the semaphore with another number of permits.
//
// Bounded cache: at most WithMaxSize keys stay cached, least recently used
// first out. An evicted semaphore is closed as soon as nothing obtained
// through the group still uses it — no Acquire waiting on it and no permit
// from it unreleased — and not before. A key used again after its eviction
// is opened afresh. Every permit must therefore be released (Do does it),
// including a lost one, whose Release reports the loss and touches nothing:
// an unreleased permit keeps its semaphore open until Close.
//
// Close closes every semaphore the group opened, wakes callers waiting in
// Acquire (they return tokensem.ErrClosed) and makes later calls return
// tokensem.ErrClosed. Permits already held stay valid until released or
// lost, and releasing them still works: that is the contract of
// tokensem.Semaphore.Close, which natssem and amqpsem both keep.
package semgroup

// Package tokensem is a distributed counting semaphore whose N permits are N
// persistent token messages in a broker you already run: NATS JetStream
// (package natssem) or RabbitMQ (package amqpsem). This package is broker
// neutral: the token format, the Semaphore and Permit interfaces, errors,
// options and Do.
//
// # Guarantees
//
// Safety: at any instant at most N callers hold a valid permit of a
// semaphore of N permits, through holder crashes, duplicate deliveries,
// stale holders and duplicated tokens. A token's index is its identity: two
// tokens of one index are one permit, never two.
//
// Loss notification: a holder learns it lost its permit (Permit.Done closes,
// Permit.Err wraps ErrLeaseLost) no later than the moment another caller
// could be given it, as long as the holder's process runs. A frozen process
// (stopped, swapped out, paused past its lease) cannot learn anything; for
// that case every permit carries a fencing number (Permit.Fence) that grows
// each time a slot changes hands, so the protected resource can reject a
// stale holder by remembering the highest fence it has seen per slot.
//
// Liveness: a crashed holder's permit comes back within its lease (NATS) or
// as soon as its connection drops (RabbitMQ); a released permit goes to the
// longest-waiting caller by push, without polling.
//
// Seams: all of the above across a semaphore's lives (a Delete, then an
// Init of the same name with another count or lease, while handles of the
// old life stay open), across the copies of a token a repair issues, and
// across resizes. Each life has an epoch of its own that its tokens carry,
// and a token is admitted only by its own life's configuration; a slot's
// fence never goes back for a name (each backend's doc says which clock
// that assumes); and a copy of a token is made only after every holder that
// could still believe it holds has been told, or has passed the bound after
// which it tells itself.
//
// Cancellation: a wait that ends because its ctx ended (Acquire, AcquireN,
// TryAcquireN, AcquireAll, Do) returns ctx.Err() itself, so callers may
// compare it with ==, and changes nothing.
//
// # Use
//
//	sem, err := natssem.Open(ctx, nc, "gpu-pool")
//	...
//	err = tokensem.Do(ctx, sem, func(ctx context.Context) error {
//		return train(ctx) // ctx is cancelled if the permit is lost
//	})
//
// Tokens may be signed with a shared key (WithKey in each backend): then
// unsigned or forged tokens never admit anyone.
package tokensem

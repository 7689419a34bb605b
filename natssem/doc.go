// Package natssem implements tokensem semaphores on NATS JetStream.
//
// A semaphore called NAME is:
//   - the work-queue stream TOKENSEM_NAME (subject tokensem.NAME.tokens)
//     holding one token message per permit, and its durable pull consumer
//     "holders", whose ack wait is the lease;
//   - the KV bucket tokensem_NAME holding the configuration (key "config":
//     permits, lease, epoch, signing-key check) and one lease record per slot
//     (key "slot.I").
//
// # Protocol
//
// Acquire sends one pull request for one message; the server queues pull
// requests and serves them strictly in order, so waiters are served FIFO
// with no polling. A delivered token is only a candidate. JetStream matches
// acks by stream sequence alone, so a stale holder's Nak can hand a token to
// a third client while someone else still holds it, and its Ack can delete
// the token. Ownership is therefore decided by the slot's lease record: a
// delivery becomes a permit only by a compare-and-set of that record, and
// the revision written is the permit's fencing number.
//
//   - Free record: compare-and-set it to us. We hold the permit.
//   - Record held, and written less than one lease ago by the server's clock
//     (entry timestamp against the server time in consumer info): the holder
//     is alive and the delivery came from a stale Nak; step away without
//     touching it. If the record names another stream sequence, this
//     delivery is a duplicate token of a held slot: delete it.
//   - Record held but silent for a whole lease: its holder gave up (see
//     below); take it over by compare-and-set.
//
// A holder renews every lease/3: a compare-and-set of its record, then an
// in-progress ack. Its local deadline is the send time of its last
// successful record write plus the lease, minus lease/5; the server stamps
// that write later than it was sent, so the holder gives up (Done closes)
// before anyone can take the slot over. Release is a compare-and-set of the
// record to free and, only if that succeeds, a Nak that hands the token to
// the next waiter. A holder whose compare-and-set fails was taken over: it
// touches nothing. Junk, forged, foreign and retired tokens are removed by
// the acquirer that receives them.
//
// Costs on loopback: acquire is one pull plus one compare-and-set, release
// one compare-and-set plus a one-way Nak (see BenchmarkCycle and
// BenchmarkHandoff).
//
// # Limits
//
// Takeover compares server timestamps, so it assumes the server's wall
// clock does not jump forward by a lease (NTP slewing is fine). Callers that
// wait longer than the pull expiry (default 5 minutes) re-queue at the back.
// Waiters across all clients are capped by WithMaxWaiters.
package natssem

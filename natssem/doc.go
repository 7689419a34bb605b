// Package natssem implements tokensem semaphores on NATS JetStream.
//
// A semaphore called NAME is a work-queue stream, TOKENSEM_NAME, holding
// one token message per permit and read through one durable pull consumer
// whose ack wait is the lease, and a KV bucket, tokensem_NAME, holding its
// configuration, a lease record per slot and the admin lock. Init creates
// them idempotently; Open binds to them.
//
// Acquire queues one pull request at the server, which serves waiters by
// class (tokensem.WithPriority; the pull's priority, nats-server 2.12 and
// later) and in the order they asked within one. A delivered token becomes a permit only by a
// compare-and-set of its slot's record, whose revision is the permit's
// fence. A holder renews the record every lease/3 and gives the permit up
// (Done closes) at lease − lease/5 after its last landed renewal, before
// anyone can take the slot over; Release frees the record and hands the
// token back to the next waiter.
//
// A broker that does not answer for a while (an election, a restart) is
// waited out; a refusal of the user's permissions is not: it returns
// tokensem.ErrPermissionDenied naming the subject. Every record read from
// the broker is bounded and checked (tokensem.ErrInvalidRecord).
// WithGroup makes a semaphore one key of a group, many semaphores sharing
// one stream and one bucket (see package semgroup).
//
// The protocol in full (lives and fences, the clock bound, deletion, what a
// client with rights can and cannot do, groups) is in docs/protocol-nats.md
// at the module's root, and the rights each role needs in
// docs/permissions-nats.md.
package natssem

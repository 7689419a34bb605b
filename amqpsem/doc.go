// Package amqpsem implements tokensem semaphores on RabbitMQ.
//
// A semaphore called NAME is:
//   - the durable queue tokensem.NAME (quorum by default, classic as an
//     option) holding one persistent token message per permit, published
//     with publisher confirms;
//   - the quorum queue tokensem.NAME.cfg holding its configuration (permits,
//     epoch, signing-key check) as exactly one message: a reader takes it
//     with basic.get and requeues it at once, so Open needs only the name; a
//     writer (under the creation lock) replaces it in one AMQP transaction
//     (publish the next version, ack the old), which RabbitMQ applies whole
//     or not at all;
//   - one classic claim queue tokensem.NAME.claim.I per slot that has ever
//     been held, created on first use, and the exclusive queue
//     tokensem.NAME.lock while an Init, a resize or a reconcile runs.
//
// Semaphores made by an older amqpsem, which kept the configuration as
// copies in the classic queue tokensem.NAME.config, are moved to the quorum
// queue by the first Open or Init (the classic queue is left for older
// clients; delete it once none runs).
//
// # Protocol
//
// Acquire consumes the token queue on a channel of its own with prefetch 1
// (TryAcquire takes a ready token with basic.get): the broker pushes a
// returned token to a waiting consumer, so waiters are served without
// polling. On its first delivery the waiter cancels its
// consumer and claims the token's slot with an exclusive consumer on the
// slot's claim queue. Holding is keeping the delivery unacked. The broker
// refuses a second exclusive consumer (403), so a duplicated token can never
// admit two holders of one slot: it is returned and retried after a pause.
// Release cancels the claim, then rejects the token with requeue, which puts
// it behind the waiters already queued.
//
// # Guarantees and how they hold here
//
// A holder's channel and claim live and die with its connection: when the
// process dies or its connection drops, the broker requeues the token and
// frees the claim at once (measured 2–7 ms). Conn's watchdog confirms the
// connection every heartbeat/2 and gives up after 1.5 heartbeats of
// silence, before RabbitMQ (which waits about two heartbeats, measured 3 s
// for a 1 s heartbeat on 3.10.8) requeues the tokens, so a holder whose
// process runs learns of a loss first. Fence is the quorum queue's delivery
// count of the token plus one, on top of a fence base that a token issued
// by the reconciler carries (a new generation per reconcile run, stored in
// the configuration), so a slot's fences keep growing when its lost token
// is replaced. Classic queues do not count deliveries: Fence is only the
// base there (0 for Init's tokens). A duplicated token message (which the
// claim keeps from admitting a second holder) counts on its own until the
// reconciler removes it, so fences are monotonic per slot only while the
// slot has one message.
//
// RabbitMQ 4.x drops a quorum-queue message silently once it has been
// returned more than the delivery limit (default 20). Init reads the server
// version and disables the limit on 4.x; on 3.x it sets nothing, because
// there the disabling values drop a token on its first return.
//
// # Clusters
//
// Dial takes a comma-separated list of the nodes' URLs; the connection
// fails over to the next node when one goes away. Losing one node of three
// loses the connections to it and nothing else:
//   - permits held through the lost node are lost (Done closes at once: the
//     connection broke), and their tokens return once the token queue has
//     a leader again (under a second, measured on 3.10.8), unless the
//     broker keeps them for consumers that are gone (below);
//   - callers waiting through the lost node go on waiting through another;
//   - the token and configuration queues are quorum queues and keep
//     working through an election. RabbitMQ answers a basic.get on a
//     quorum queue without a leader by closing the whole connection (541),
//     and with it every permit held on it, so Acquire and configuration
//     reads consume instead (a consumer waits for the new leader); only
//     TryAcquire and a census take messages with basic.get (a census needs
//     the broker's "empty" answer), so give reconcilers a connection of
//     their own;
//   - a claim queue lives on the node it was first declared through and
//     dies with it; the broker cancels the claim of a holder connected
//     elsewhere, which claims the slot again at once (and a reconcile looks
//     a missing slot's claim up again a second after its census before it
//     issues a token).
//
// RabbitMQ 3.10 can keep the token of a holder on a lost node checked out
// to a consumer that no longer exists, until the token queue's leader
// restarts (rabbitmq-server's open issue "Quorum queue accumulates orphaned
// unacked messages after leader election"). AMQP shows no count of
// unacknowledged messages; Status warns when the queue counts consumers that
// neither hold a permit nor take the ready tokens. Once every other token is
// held, such orphans would stop every waiter, so a caller of Acquire that
// has waited WithOrphanRepair's interval (default 10 s) with no token looks
// up every slot's claim, and if a slot has no holder it runs a repair on a
// connection of its own, which issues a replacement for a slot that neither
// a ready token nor a claim names; a later reconcile removes the copy as a
// duplicate once it returns (the claim refuses it meanwhile). To release
// the orphans, restart the node that leads the token queue (rabbitmq-queues
// quorum_status names it).
//
// # Listing and deleting
//
// AMQP cannot list queues, so Init registers every semaphore it creates in
// a registry queue, and List reads it (see registry.go for how it stays
// right under concurrent Init, List and Delete). Delete and ForceDelete
// remove the semaphore's queues and its registry entries under its
// creation lock, which Init takes too; Delete first takes every slot's
// claim consumer itself, so that it refuses while a permit is held and no
// permit can be taken while it removes the queues.
//
// # Connections, TLS and credentials
//
// Dial takes amqp:// or amqps:// URLs (or a list of them) with credentials
// in the URL. For amqps://, WithTLS sets the TLS configuration (default:
// the system's roots and the URL's host, or amqp091's
// cacertfile/certfile/keyfile URL parameters). A refused login wraps ErrAuth, a failed TLS handshake
// ErrTLS, a broker that cannot be reached ErrUnreachable, and a publish
// that waited while the broker blocked publishers (a memory or disk alarm)
// ErrBlocked, with the broker's reason. Every broker failure, ErrUnreachable
// and ErrBlocked among them, matches tokensem.ErrUnavailable.
//
// # Limits
//
// RabbitMQ has no lease: a holder keeps its permit until it releases, its
// connection drops, or the broker's consumer_timeout (30 minutes by
// default; 3.10 checks it once a minute) closes its channel. WithMaxHold
// (default 25 minutes) releases earlier on the client side. Status reads
// ready tokens by taking and requeueing them, so a census makes them
// unavailable for an instant and moves them to the back of the queue. A
// duplicated token circulates (without admitting anyone twice) until the
// reconciler removes it. A token is delivered to the longest-subscribed
// waiter; a waiter that met a duplicate re-subscribes at the back.
package amqpsem

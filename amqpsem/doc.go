// Package amqpsem implements tokensem semaphores on RabbitMQ.
//
// A semaphore called NAME is:
//   - the durable queue tokensem.NAME (quorum by default, classic as an
//     option) holding one persistent token message per permit, published
//     with publisher confirms;
//   - the quorum queue tokensem.NAME.cfg holding its configuration (permits,
//     epoch, signing-key check, W, fence bases, each repaired slot's
//     current token) as exactly one message: a reader takes it with
//     basic.get and requeues it at once, so Open needs only the name; a
//     writer (under the creation lock) replaces it in one AMQP transaction
//     (publish the next version, ack the old), which RabbitMQ applies whole
//     or not at all;
//   - one classic claim queue tokensem.NAME.claim.I per slot, declared by
//     Init before the first token exists, and the exclusive queue
//     tokensem.NAME.lock while an Init, a resize, a reconcile or a delete
//     runs;
//   - the direct exchange tokensem.NAME.x, bound to the token and
//     configuration queues, through which every publish goes (each write
//     declares and binds it again, so one deleted comes back).
//
// Names cannot contain '.', so one regular expression per semaphore covers
// its resources and no other's: an admin of one semaphore needs no right on
// amq.default or on any other semaphore's queues, and a client needs no
// write at all. ClientPermissions, AdminPermissions and OperatorPermissions
// give each role's RabbitMQ permissions (docs/permissions-rabbitmq.md). An
// operation the broker refuses for the user's permissions fails at once,
// without retries, with an error wrapping tokensem.ErrPermissionDenied that
// names the permission and the resource.
//
// # Protocol
//
// Acquire consumes the token queue on a channel of its own with prefetch 1
// (TryAcquire takes a ready token with basic.get): the broker pushes a
// returned token to a waiting consumer, so waiters are served without
// polling. On its first delivery the waiter cancels its consumer and
// claims the token's slot with an exclusive consumer on the slot's claim
// queue (one round trip), then checks the token against a configuration
// read less than two seconds before. Holding is keeping the delivery
// unacked. The broker refuses a second exclusive consumer (403), so a
// duplicated token can never admit two holders of one slot: it is returned
// and retried after a pause. Release cancels the claim, then rejects the
// token with requeue, which puts it behind the waiters already queued.
//
// # Guarantees and how they hold here
//
// A holder's channel and claim live and die with its connection: when the
// process dies or its connection drops, the broker requeues the token and
// frees the claim at once (measured 2–7 ms). Conn's watchdog confirms the
// connection every heartbeat/2 and gives up 1.5 heartbeats after the send
// time of its last confirmed probe, before RabbitMQ (which waits about two
// heartbeats, measured 3 s for a 1 s heartbeat on 3.10.8) requeues the
// tokens, so a holder whose process runs learns of a loss first. That
// bound is W: the longest a holder whose connection stopped working (a
// stalled link) can still believe it holds. Init stores its Conn's W in the
// configuration (7.5 s with DefaultHeartbeat), and Open and Init refuse,
// with tokensem.ErrInvalidOption, a Conn whose heartbeat would make W
// longer; a semaphore's gate takes its semaphore's W.
//
// A holder whose slot claim the broker cancels (the claim queue was
// deleted: its node restarted or was lost, or the semaphore was deleted)
// loses its permit at once, even though its token and connection are fine:
// a holder connected to another node than its claim queue's loses its
// permit with that node. That is the safe side, because every step that
// could let a second holder have the slot waits W (and a third, for the
// notice to reach Done on a loaded machine: two heartbeats of the Conn
// that made the semaphore) while it holds the slot itself:
//   - a token that was delivered before and finds its slot's claim queue
//     gone claims the slot only through a quarantine: the queue is made
//     exclusive to one connection and held for that long, then made again
//     as every holder uses it (see claim.go; a quarantine cut short takes
//     the queue with it, so the next claimer starts one over). TryAcquire
//     starts the quarantine and leaves that token for later;
//   - a repair (reconcile --repair, or a waiter's orphan repair, see
//     WithOrphanRepair) issues a token for a missing slot only after it
//     has claimed the slot and held the claim that long, unless the token
//     queue shows at some moment that nobody holds a token at all, and at
//     least two seconds after it named the new token in the configuration,
//     so that every client refuses the slot's other tokens by then;
//   - Delete and ForceDelete, when a permit may be held, remove the token
//     and claim queues, hold the creation lock that long, and only then
//     remove the configuration, so that a new life of the name cannot be
//     claimed while a holder of the old one may still believe. A deleter
//     that dies during the wait leaves the configuration marked
//     "deleting", and the next Init or Delete waits in full first.
//
// Each Init that creates is a new life of the name, with a random epoch
// that its tokens carry: a token is admitted only by the configuration of
// its own life. Fence is a fence base plus the quorum queue's delivery
// count of the token plus one. The base is fixed when the token is issued:
// the issuing client's clock in microseconds, stored in the configuration
// (the life's, for Init's tokens; for a repaired slot, its current token's
// ID and base), not in the message, which anyone who may publish could
// forge. A slot's fences therefore keep growing across repairs, returning
// orphans and Delete followed by Init, provided the clocks of the clients
// that issue tokens do not step back by more than the time between two
// issues (a slot changes hands far less often than once a microsecond). A
// repaired slot's other tokens (its lost token, if it returns) are retired:
// refused and removed when next delivered, or by the next reconcile.
// Classic queues do not count deliveries: Fence is only the base there, the
// same for every holder of a token.
//
// What the protocol cannot see, the fence must catch:
//   - a frozen process (SIGSTOP, a long GC pause) holds past W without
//     knowing it;
//   - a holder connected to node X through a link that stalls just as X
//     dies: RabbitMQ may return X's consumers' tokens as soon as the
//     cluster sees X gone, and if the holder's claim queue lives on another
//     node, the next waiter claims the slot at once, up to W before the
//     holder gives up (a claim queue on X itself goes with X, and the
//     quarantine covers that case). A node killed while its host lives
//     resets the holder's connection, which ends the permit at once;
//   - a network partition between nodes with RabbitMQ's default partition
//     handling (ignore): a holder on the minority side can keep a permit
//     the majority hands to someone else. Run clusters with
//     cluster_partition_handling = pause_minority, which closes the
//     minority's connections.
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
// loses the connections to it and what lives only on it:
//   - permits held through the lost node are lost (Done closes at once: the
//     connection broke), and their tokens return once the token queue has
//     a leader again (under a second, measured on 3.10.8), unless the
//     broker keeps them for consumers that are gone (below);
//   - permits whose slots' claim queues lived on the lost node (all of a
//     semaphore's live on the node Init went through) are lost too (the
//     broker cancels their claims), and their slots come back after a
//     quarantine of W and a third;
//   - callers waiting through the lost node go on waiting through another;
//   - the token and configuration queues are quorum queues and keep
//     working through an election. RabbitMQ answers a basic.get on a
//     quorum queue without a leader by closing the whole connection (541),
//     and with it every permit held on it, so Acquire and configuration
//     reads consume instead (a consumer waits for the new leader); only
//     TryAcquire and a census take messages with basic.get (a census needs
//     the broker's "empty" answer), so give reconcilers a connection of
//     their own.
//
// RabbitMQ 3.10 can keep the token of a holder on a lost node checked out
// to a consumer that no longer exists, until the token queue's leader
// restarts (rabbitmq-server's open issue "Quorum queue accumulates orphaned
// unacknowledged messages after leader election"). AMQP shows no count of
// unacknowledged messages; Status warns when the queue counts consumers that
// neither hold a permit nor take the ready tokens. Once every other token is
// held, such orphans would stop every waiter, so a caller of Acquire that
// has waited WithOrphanRepair's interval (default 10 s) with no token looks
// up every slot's claim, and if a slot has no holder it runs a repair on a
// connection of its own, which issues a replacement for a slot that neither
// a ready token nor a claim names (after the wait above); the orphan, when
// it returns, is retired by it. To release the orphans, restart the node
// that leads the token queue (rabbitmq-queues quorum_status names it).
//
// # Listing and deleting
//
// AMQP cannot list queues, so Init registers every semaphore it creates in
// a registry queue, through the registry's exchange, and List reads it
// (see list.go for how it stays right under concurrent Init, List and
// Delete). List sets the registry up; an admin of one semaphore may only
// publish to its exchange. Delete removes the semaphore's entries if it
// may, waiting at most the request timeout for the registry's lock, and
// leaves them to List otherwise. Delete and ForceDelete
// remove the semaphore's queues and its registry entries under its
// creation lock, which Init takes too; Delete first takes every slot's
// claim consumer itself, so that it refuses while a permit is held and no
// permit can be taken while it removes the queues.
//
// The creation lock (an exclusive queue) lives with the connection that
// declared it, while a Conn reconnects behind its callers' backs. The work
// done under the lock (Init's creation, a resize's configuration write, a
// reconcile's removals and issues, a delete) runs only on channels of that
// connection: once it is lost, the work fails (and a retry takes the lock
// again) instead of going on, unlocked, over the next connection.
//
// # What is read is checked
//
// Anyone who can write a semaphore's configuration queue or the registry
// can write any message, at any size, so each is bounded and checked as it
// is read, and errors quote at most 32 bytes of it:
//   - the configuration: at most 1 MiB (larger is refused unparsed), and at
//     most 4 KiB plus 96 bytes per reissued slot it names (room for about
//     13,000; a repair that would write more fails instead); version 1; a
//     known state and queue type; permits 1..tokensem.MaxPermits; epoch
//     1..2^53-1; W at most the bound of the longest heartbeat AMQP can
//     negotiate (65,535 s); issued slots at most tokensem.MaxPermits; fence
//     bases below 2^63; and each reissued slot below tokensem.MaxPermits,
//     with a 32-hex token id and a base above 0. A bad one fails that
//     semaphore alone, at the cost of receiving it once (the configuration
//     queue keeps no message above 2 MiB and 64 KiB, see configQueueArgs):
//     Open, Init, Status,
//     Acquire, Resize and Delete return an error wrapping
//     tokensem.ErrInvalidRecord that names ForceDelete; List lists it with
//     State "invalid" and the reason in Info.Warning. Init refuses rather
//     than start a life over it, because it cannot tell who may still hold
//     a permit of the unreadable one, nor their W. ForceDelete removes it:
//     it writes a "deleting" configuration in its place whose slots are
//     those that have a claim queue (looked for from slot 0 on, until 64 in
//     a row are missing) or a ready token, and whose W is the longer of its
//     own Conn's and DefaultHeartbeat's, and removes the semaphore as it
//     removes any other (its holders are told by their claim queues'
//     deletion). A holder whose claim queue lies past such a gap (possible
//     only after the node that made the claim queues was lost) is not told;
//     its fence still tells it apart. Delete refuses it.
//   - registry entries: at most 256 bytes, JSON naming a valid name; List
//     drops any other at once.
//   - the configuration queue holds exactly one message: a reader that is
//     delivered a second one, or sees one counted ready while it holds the
//     first, and a writer whose basic.get leaves one, refuse the semaphore
//     as invalid (amqpsem's writers never leave two), as above.
//   - claims held without a token (a client consuming the claim queues
//     exclusively keeps the slots from every acquirer): Status reports the
//     semaphore unhealthy, saying so, and a reconcile fails with
//     ErrClaimsSquatted rather than remove the ready tokens as duplicates.
//     It cannot be prevented: claiming needs read on the claim queues.
//
// # Cancellation
//
// Acquire and TryAcquire (and so tokensem.Do) return ctx.Err() itself once
// ctx has ended, whatever step it cut short, and return promptly: after
// ctx ends no step waits for the broker (a call it has not answered is
// abandoned, and its channel closed in the background), so a call returns
// within its deadline plus the Go scheduler's delay in waking it plus
// 150 ms, which the package's test checks under load. There, with four
// CPU-bound goroutines in the process on a busy 2-core machine, a bare
// wait on a context's 3 ms deadline woke up to 415 ms late, and calls
// returned at worst 304 ms after their deadline.
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
// Callers waiting in Acquire are capped per Conn (WithMaxConnWaiters)
// and per Semaphore (WithMaxLocalWaiters): one more fails with
// tokensem.ErrTooManyWaiters.
//
// RabbitMQ has no lease: a holder keeps its permit until it releases, its
// connection drops, or the broker's consumer_timeout (30 minutes by
// default; 3.10 checks it once a minute) closes its channel. WithMaxHold
// (default 25 minutes) releases earlier on the client side. Status reads
// ready tokens by taking and requeueing them, so a census makes them
// unavailable for an instant and moves them to the back of the queue. A
// duplicated token circulates (without admitting anyone twice) until the
// reconciler removes it. A token is delivered to the longest-subscribed
// waiter; a waiter that met a duplicate re-subscribes at the back. Init
// declares one claim queue per permit (about a millisecond each on a busy
// 2-core machine), so an Init of thousands of permits takes seconds. A
// repair, a delete with permits held, and the first claim of each slot
// after its claim queue's node restarted, take W and a third (10 s with
// DefaultHeartbeat).
package amqpsem

// Package natssem implements tokensem semaphores on NATS JetStream.
//
// A semaphore called NAME is:
//   - the work-queue stream TOKENSEM_NAME (subject tokensem.NAME.tokens)
//     holding one token message per permit, and its durable pull consumer
//     "holders", whose ack wait is the lease;
//   - the KV bucket tokensem_NAME holding the configuration (key "config":
//     permits, lease, epoch, signing-key check) and one lease record per slot
//     (key "slot.I"), and the admin lock (key "lock").
//
// # Protocol
//
// Acquire sends one pull request for one message; the server queues pull
// requests and serves them strictly in order, so waiters are served FIFO
// with no polling. Pull requests live on the consumer's leader only: a
// leader change ends them (409), and their callers, like callers whose pull
// expired or whose connection was re-established, ask again at the back of
// the queue. A delivered token is only a candidate. JetStream matches
// acks by stream sequence alone, so a stale holder's Nak can hand a token to
// a third client while someone else still holds it, and its Ack can delete
// the token. Ownership is therefore decided by the slot's lease record: a
// delivery becomes a permit only by a compare-and-set of that record, and
// the revision written is the permit's fencing number.
//
//   - Free record: compare-and-set it to us. We hold the permit.
//   - Record held, and written less than one lease ago by the server's clock
//     (entry timestamp against the server time in consumer info): the holder
//     may have released the token while this read came from a replica that
//     has not applied the free write yet, so read the record again at growing
//     intervals, for up to a second (or the request timeout, if shorter; not
//     in TryAcquire), and decide afresh once another holder's or a free record
//     shows. If none does, the holder is alive and the delivery came from a
//     stale Nak: step away without touching it. If the record names another
//     stream sequence, and the stream holds a token of the same slot and
//     life there (a direct get), this delivery is a duplicate token of a
//     held slot: delete it. If the stream holds no such token, step away
//     (see "What a client can do").
//   - Record held but silent for a whole lease: its holder gave up (see
//     below); take it over by compare-and-set, then delete the copy the
//     record named if it is a token of the same slot and life.
//
// A holder renews every lease/3: a compare-and-set of its record, then an
// in-progress ack. It holds its permit until the send time of its last
// successful record write plus the lease minus lease/5 (its deadline); the
// server stamps that write later than it was sent, so the holder gives up
// (Done closes) before anyone can take the slot over. Release is a
// compare-and-set of the record to free and, only if that succeeds, a Nak
// that hands the token to the next waiter. A holder whose compare-and-set
// fails was taken over: it touches nothing. Junk, forged, foreign and
// retired tokens are removed by the acquirer that receives them.
//
// Every step of a claim after its write is bounded by that deadline, and a
// claim whose write is answered with less than lease/10 left (a slow
// broker, an election) frees the record again and hands the token on
// instead of returning a permit that is about to expire.
//
// Costs on loopback: acquire is one pull plus one compare-and-set (after a
// read of the record when another client freed it), release one
// compare-and-set plus a one-way Nak (see BenchmarkCycle and
// BenchmarkHandoff).
//
// # Lives and fences
//
// A semaphore lives from the Init that creates it to the Delete that ends
// it; an Init of the name after that begins another life, perhaps with
// another count and lease, while clients that opened the old one keep
// their handles. A life is an identity: its configuration's epoch, a random
// number (below 2^53) no other life of the name shares. Its tokens carry
// it and its slot records name it. A delivered token is admitted only by
// the configuration of its own life (a handle whose cached configuration
// is of another life reads it again first, and adopts it), and its claim
// uses that life's lease. A record written in another life binds nobody;
// a claim that cannot tell which life a record belongs to (one it creates,
// or one an admin path wrote) checks the configuration on the bucket's
// stream leader before it makes a permit, and undoes its write if its
// token's life has ended (claim.go). So a permit is only ever handed out
// in its token's life, by that life's count and lease.
//
// Fences are the slot records' revisions, which are the bucket's stream
// sequence. A bucket made for a new life (or a group's bucket an operator
// removed and Init made again) starts its sequence at the server's clock
// in microseconds, read from the token stream's info as Init makes the
// bucket. So a name's fences never go back across lives as long as that
// clock reading exceeds the previous life's by more than the previous
// bucket's number of writes (one per claim, renewal and release; read as
// microseconds): the time from one Init to the next must be longer than
// any backward step of the server's clock between them, and, on a cluster,
// than the lag of the node answering the later Init behind the node that
// answered the earlier one. A key of a group keeps its group's bucket,
// whose sequence only grows. Within a life, every claim writes its slot's
// record, so fences grow with every change of hands, across repairs and
// resizes.
//
// # Clocks
//
// A takeover compares two server timestamps: the time the server stamped
// the holder's last record write (w) and the server time in the consumer
// info the taker reads (now); it takes over when now - w >= lease. The
// holder, for its part, measures lease - lease/5 on its own monotonic clock
// from the moment it sent that write. So the promise "a running holder
// learns of its loss before anyone else holds its slot" holds exactly as
// long as
//
//	(clock that answers consumer info) - (clock that stamped the write) < lease/5
//
// measured between the two instants involved: a server clock stepped forward
// between the stamp and the read, and in a cluster the skew between the
// node leading the KV bucket's stream (which stamps records) and the node
// leading the token consumer (which answers consumer info), both count
// against that lease/5. Clocks stepped backward, or a slower server clock,
// only delay takeovers. The client's wall clock plays no part; NTP slewing
// is harmless. Beyond the bound, or while a holder's process is frozen, the
// fence still tells the stale holder's writes from the new holder's.
//
// The record's age is the only guard for a delivery that comes early: a
// stale Nak, a duplicate token, a consumer restarted with the token
// pending. A token whose holder just went silent is otherwise redelivered
// only a lease after the holder's last in-progress ack, timed by the
// server's monotonic clock, which no clock step moves.
//
// # Failures
//
// A request the broker does not answer (a stream or consumer electing a new
// leader, a node restarting) is retried: Acquire waits on until its ctx
// ends, and a holder keeps renewing until its deadline. An election that
// lasts longer than a holder's margin (lease minus lease/5 minus the time
// since its last renewal) costs that holder its permit (Done closes) — the
// safe side. Choose the lease well above the cluster's election time (see
// docs/reliability.md for measured figures).
//
// Request timeouts (WithRequestTimeout) must be shorter than lease - lease/5;
// unset, they default to the smaller of tokensem.DefaultRequestTimeout and
// a quarter of the lease.
//
// A publish or subscription the user's NATS permissions refuse is not
// retried: natssem hears the server's permissions violation on the
// connection's error handler (it puts itself in front of the handler the
// connection has, which is still called) and ends the calls of the
// semaphore whose stream, bucket, consumer or subject was refused, or every
// call on the connection for a refused inbox, at once with an error that
// wraps tokensem.ErrPermissionDenied and names the subject. A handler set
// on the connection after the first Semaphore replaces natssem's; refusals
// then show as timeouts. The permissions each role needs, and why each user
// wants an inbox prefix of its own (nats.CustomInboxPrefix), are in
// docs/permissions-nats.md.
//
// # Listing and deleting
//
// List reads the server's KV buckets. Delete marks the configuration
// "deleting" under the admin lock, refuses while a live holder holds a
// slot, closes every slot record by compare-and-set so that no claim can
// win meanwhile, then removes the stream and the bucket (see delete.go);
// an Init of the name waits for it, then creates the semaphore afresh.
// The admin lock (which Resize and reconcile runs take too) fences what its
// holder does: it believes it holds the lock only until a fifth of the
// lock's TTL before anyone could take it over, its record writes are
// compare-and-sets on revisions that never repeat across lives, and each
// removal follows a renewal written by compare-and-set. Only a process
// frozen for longer than that fifth between such a renewal and the removal
// it sends can remove what it no longer owns.
// ForceDelete closes held slots too: a holder learns it at its next
// renewal, and ForceDelete waits until its lease has run out. A waiter
// learns it when its pull is refused. A delete closes the slots of the
// configuration, of every record and of every token in the stream, and
// no others.
//
// # What is read is checked
//
// Anyone who can write the bucket can write any record, at any size, so
// every record is bounded and checked as it is read, and errors quote at
// most 32 bytes of it:
//   - the configuration: at most 4 KiB (larger is refused unparsed);
//     version 1 or 2; permits 1..tokensem.MaxPermits; lease within
//     [tokensem.MinLease, tokensem.MaxLease]; epoch 1..2^53-1; a known
//     state; key check and seeder at most 64 bytes. A bad one fails that
//     semaphore alone, at the cost of reading it: Open, Init, Status,
//     Acquire, Resize and Delete return an error wrapping
//     tokensem.ErrInvalidRecord that names ForceDelete; List lists it with
//     State "invalid" and the reason in Info.Warning. Init refuses rather
//     than start a life over it, because it cannot tell who may still hold
//     a permit of the unreadable one. ForceDelete removes it: it judges
//     holders by the slot records of any life, with the token consumer's
//     AckWait as their lease, closes those records, waits that lease, and
//     removes the stream and bucket. Delete refuses it.
//   - slot records: at most 4 KiB; epoch below 2^53; holder, token and
//     releaser ids at most 64 bytes, the holder's name at most 128. A bad
//     one counts as free, held by nobody (a claim replaces it), and Status
//     warns of it. A key slot.I with I outside [0, tokensem.MaxPermits), or
//     not written as a plain number, is no slot.
//   - the admin lock's record: at most 4 KiB, names of a client's length;
//     anything else is no client's lock, and free.
//   - a group's generation record: the 32-hex id a bump writes; anything
//     else vouches for no configuration (each key reads its own).
//
// # What a client can do
//
// A client's rights on a semaphore (pull from its consumer, ack, direct
// get, write its slot records, delete its messages) are enough to lie to
// every other client of it: the broker cannot tell its writes from an
// honest client's. What such a user must not be able to do, and what stops
// it:
//   - Delete real tokens through a forged record. A held record that names
//     a stream sequence is believed only as far as the stream bears it out:
//     a delivery is deleted as a duplicate only if the sequence the record
//     names holds a token of the same slot and life (claim.go, tokenLives),
//     and a takeover deletes the old copy only on the same check. A record
//     naming anything else makes the acquirer step away; it deletes
//     nothing.
//   - Block a slot for good with a delete mark. A record marked deleted is
//     honoured only while the configuration says a Delete runs (a Delete
//     marks it before it closes a slot, and a refused one reopens its
//     slots before it unmarks it); otherwise a claim judges the record
//     without the mark and writes it over, and Status warns of it.
//   - Make a held token vanish unseen. An ack of a held token removes it
//     from a semaphore's own (work-queue) stream, a message delete from
//     any stream, and the holder's Nak then hands nothing back. Status and
//     reconcile report the slot unhealthy at once (held by a record naming
//     no token in the stream), and once its holder releases, the slot is
//     missing and reconcile issues it again. The holder keeps its permit:
//     its record still keeps everyone else off the slot, and a holder told
//     of a loss would be told wrongly when a shrink or a reconcile removed
//     a token its census saw free just as a claim took it (the claim's
//     record is written after the census read). Not covered: an ack of a
//     group key's token, which its group's stream keeps (it stays readable
//     while its consumer never delivers it again).
//
// What is left is inherent in the rights and is not closed:
//   - A user who may write slot records may hold a slot without a token,
//     as long as it keeps rewriting a held record (as it may hold a permit
//     by acquiring one). Status and reconcile report such a slot unhealthy
//     (held by a record naming no token in the stream); once the record is
//     no longer rewritten it falls a lease silent and is taken over.
//   - A user who may write slot records may free or take another holder's
//     record, and Nak its token to hand the slot on. The holder learns it
//     at its next renewal (its compare-and-set fails), within a third of
//     the lease; until then two clients believe they hold the slot, and
//     only fences tell them apart: a resource that checks fences refuses
//     the older holder's writes.
//   - A user who may ack or delete messages may remove tokens that nobody
//     holds; acquirers stop seeing them, and Status reports the slots
//     missing until a reconcile issues them again. A group key's token
//     acked by someone else stays in the stream, undelivered, and Status
//     does not see it.
//
// Slot records are not signed, even with a signing key: every client of a
// signed semaphore holds the key (it verifies tokens with it), and a user
// without it could still write back a record it read earlier (an old free
// or held record of the slot), which a signature does not stop. The checks
// above rest on the stream instead, which a client can take from but not
// add to.
//
// # Groups
//
// WithGroup makes a semaphore one key of a group, for many semaphores of
// one kind (one per tenant, per route: see semgroup). The keys of group G
// share the token stream TOKENSEMG_G (key K's tokens on subject
// tokensemg.G.K.tokens, taken through the consumer holders_K filtered on
// it) and the KV bucket tokensemg_G (K's records under "K.": K.config,
// K.slot.I, K.lock). Everything above holds per key: the protocol reads
// and writes only the key's subject, consumer and records. A key costs the
// broker one consumer instead of two streams and a consumer; see
// docs/notes/per-key-costs.md for measured costs and their limits. The group's
// stream keeps messages until they are deleted instead of being a work
// queue (a work queue checks each new consumer's filter against every
// other's, so creating a key slowed as the group grew); tokens are never
// acknowledged, and junk a claimer acknowledges it also deletes, so the
// protocol is unchanged. Deleting a key deletes its consumer, its
// tokens (one by one: a purge of more than one message makes the server
// recount every consumer of the stream) and then its records; the group's
// stream and bucket stay. A key deleted and made again within the stream's
// duplicate window gets fresh message IDs (its configuration names its
// life), and the first Init of a new life deletes whatever an earlier one
// left on the subject.
//
// # Limits
//
// Callers that wait longer than the pull expiry (default 5 minutes)
// re-queue at the back. Waiters across all clients are capped by
// WithMaxWaiters.
package natssem

// Package amqpsem implements tokensem semaphores on RabbitMQ.
//
// A semaphore called NAME is a durable queue, tokensem.NAME (quorum by
// default), holding one persistent token message per permit; a quorum
// queue, tokensem.NAME.cfg, holding its configuration as one message; a
// claim queue per slot; and a direct exchange, tokensem.NAME.x, through
// which every publish goes. Dial makes a Conn; Init creates a semaphore
// idempotently and Open binds to one.
//
// Acquire consumes the token queue with prefetch 1, so the broker pushes
// a returned token to the longest-waiting caller of the highest class
// waiting (tokensem.WithPriority; the consumer's priority). The waiter claims the
// token's slot with an exclusive consumer on the slot's claim queue (the
// broker refuses a second one, so a duplicated token never admits two
// holders) and holds the delivery unacked. A holder keeps its permit
// until it releases or its connection drops: Conn's watchdog gives the
// permit up (Done closes) within W, 1.5 heartbeats, before RabbitMQ
// requeues the token. Release cancels the claim and requeues the token.
//
// A broker that fails a request for a while (a node lost, a queue electing
// a leader) is waited out; a refusal of the user's permissions is not: it
// returns tokensem.ErrPermissionDenied naming the permission and the
// resource. ClientPermissions, AdminPermissions and OperatorPermissions
// give each role's rights. Every record read from the broker is bounded
// and checked (tokensem.ErrInvalidRecord).
//
// The protocol in full (W and the stalled link, clusters, deletion,
// cancellation, TLS and credentials, limits) is in docs/protocol-rabbitmq.md
// at the module's root, and the rights each role needs in
// docs/permissions-rabbitmq.md.
package amqpsem

// Package reconciler recounts a semaphore's tokens and repairs what
// brokers, operators and crashes do to them: duplicated tokens, lost tokens,
// junk, forgeries and tokens retired by a resize. It is backend-neutral: it
// works through a driver.Inventory, which each backend provides.
//
// # Repair without raising admission
//
// A repair never lets more than N callers hold permits:
//   - Invalid messages (junk, forged, foreign, retired) are removed: they
//     admit nobody anyway. A retired token that a live holder still holds
//     (a shrink under load) stays: its holder releases it and the next
//     acquirer removes it, or admits it if the semaphore grew back.
//   - Of the valid copies of one slot, the held one (if any) is kept and the
//     others are removed; a slot admits one holder at a time whatever its
//     number of copies, so removing copies only lowers admission.
//   - A missing slot is issued only when the census proves it absent: no
//     message for it and no live holder of it. The backend's Issue guards
//     the proof against a change since the census (on NATS, a
//     compare-and-set of the slot's lease record at the revision the census
//     saw), so two reconcilers running at once cannot both issue it.
//
// # A sound census on each broker
//
// NATS (natssem.Inventory): every message of the work-queue stream,
// delivered or not, is read by direct get, and each slot's lease record
// says who holds it. The records are read before the messages, so a token
// that moves between the two reads is seen at least once. A slot is absent
// when no message names it and its record is free; Issue publishes with a
// de-duplication ID naming the record revision the census saw and then
// moves that revision by compare-and-set, so two reconcilers that saw the
// same state publish one token between them.
//
// RabbitMQ (amqpsem.Inventory): a held token is an unacknowledged delivery
// that nobody else can read. Every holder therefore keeps an exclusive
// consumer on its slot's claim queue for as long as it holds (the broker
// drops it with the holder's channel or connection), and the census counts
// a slot as held when its claim queue has a consumer. The ready tokens are
// all taken onto the census's channel and kept unacknowledged until the
// run ends, so none can move while it runs; the broker's empty answer
// proves none was left behind. A slot is absent when no ready token and no
// claim names it; the run holds the semaphore's exclusive lock queue, so
// two reconcilers never issue at once. One window remains: a token a
// waiter has received but not yet claimed is seen by neither; issuing its
// slot then makes a duplicate, which the claim keeps from admitting a
// second holder and which the next run removes.
//
// # Fencing across repairs
//
// A reissued slot's fences continue above its lost token's: on NATS the
// fence is the slot record's revision; on RabbitMQ a reissued token
// carries a fence base from a generation counter in the configuration.
package reconciler

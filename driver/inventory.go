package driver

import "context"

// Inventory is what a backend offers the reconciler.
type Inventory interface {
	// Lock serializes reconcilers of one semaphore for the length of a run
	// (backends whose Issue is guarded otherwise may return a no-op), and
	// unlock releases everything the run held.
	Lock(ctx context.Context) (unlock func(), err error)
	// Census reads every token message and every live holder.
	Census(ctx context.Context) (Census, error)
	// Remove deletes one message found by the latest Census.
	Remove(ctx context.Context, e Entry) error
	// Issue publishes a token for index if the slot is still as the latest
	// Census saw it (absent, unheld); otherwise it returns ErrConflict.
	Issue(ctx context.Context, index int) error
}

// Gated is an Inventory whose semaphore may have a gate: the one-permit
// semaphore its weighted callers (tokensem.Weighted) take turns through,
// whose token can be lost or copied like any other. natssem's and
// amqpsem's inventories are Gated; reconciler.Run reconciles the gate
// after the semaphore.
type Gated interface {
	Inventory
	// Gate returns the gate's inventory, or nil when the semaphore has no
	// gate (no weighted caller ever gathered permits).
	Gate(ctx context.Context) (Inventory, error)
}

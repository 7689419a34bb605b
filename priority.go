package tokensem

import (
	"context"

	"github.com/tokensem/tokensem/internal/ctxclass"
)

// Priority is the class a caller waits in for a permit. When a permit
// frees, the broker itself hands it to a waiting caller of the highest
// class, and within a class to the one that has waited longest; a caller
// that never sets a class waits in class 0, so callers who never set one
// are served in arrival order, as without classes.
//
// Classes are strict: a lower class is served only while no caller of a
// higher class waits, so a steady stream of higher-class callers can keep
// a lower class waiting for as long as it lasts. Give bulk work the lower
// class and bound its wait with ctx; a class is not a share.
type Priority int

// The classes a backend serves: ten, the most NATS JetStream can order.
const (
	LowestPriority  Priority = -4
	HighestPriority Priority = 5
)

// WithPriority returns a copy of ctx under which a wait for a permit
// (Acquire, AcquireN, AcquireAll, Do, and what calls them) waits in class
// p. The class is inherited by everything ctx is passed to: Do's fn, and
// every acquire made under it, on any semaphore. A class outside
// [LowestPriority, HighestPriority] makes those waits fail with
// ErrInvalidOption; a backend that cannot serve classes refuses a wait in
// any class but 0 with ErrPriorityUnsupported. TryAcquire does not wait,
// and takes a free permit whatever the class.
func WithPriority(ctx context.Context, p Priority) context.Context {
	return ctxclass.With(ctx, int(p))
}

package tokensem

import (
	"context"
	"fmt"
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

type priorityKey struct{}

// WithPriority returns a copy of ctx under which a wait for a permit
// (Acquire, AcquireN, AcquireAll, Do, and what calls them) waits in class
// p. A class outside [LowestPriority, HighestPriority] makes those calls
// fail with ErrInvalidOption; a backend that cannot serve classes refuses
// any class but 0 with ErrPriorityUnsupported.
func WithPriority(ctx context.Context, p Priority) context.Context {
	return context.WithValue(ctx, priorityKey{}, p)
}

// PriorityOf returns the class ctx asks for (0 when none), or an error
// wrapping ErrInvalidOption for a class out of range. Backends call it.
func PriorityOf(ctx context.Context) (Priority, error) {
	p, _ := ctx.Value(priorityKey{}).(Priority)
	if p < LowestPriority || p > HighestPriority {
		return 0, fmt.Errorf("%w: priority %d is outside [%d, %d]", ErrInvalidOption, p, LowestPriority, HighestPriority)
	}
	return p, nil
}

// Package ctxclass carries a wait's priority class in a context: the
// root package's WithPriority puts it there, and backends read it through
// driver.PriorityOf.
package ctxclass

import "context"

type key struct{}

// With returns a copy of ctx carrying class p.
func With(ctx context.Context, p int) context.Context { return context.WithValue(ctx, key{}, p) }

// Of returns the class ctx carries, 0 when none.
func Of(ctx context.Context) int {
	p, _ := ctx.Value(key{}).(int)
	return p
}

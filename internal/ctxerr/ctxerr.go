// Package ctxerr is the one rule by which a call that ended because its
// context did reports it: with ctx.Err() itself, not an error wrapping it,
// so that callers may test err == context.Canceled as with x/sync's
// semaphore. The root package, the weighted gatherer and the backends
// apply it where a wait or a broker call under the caller's ctx returns.
package ctxerr

import (
	"context"
	"errors"
)

// Caused reports whether err is what the end of ctx made of a call: ctx has
// ended and err matches context.Canceled or context.DeadlineExceeded,
// however wrapped and by whichever inner call it cut short. An error while
// ctx is live (a broker round trip's own timeout) is not.
func Caused(ctx context.Context, err error) bool {
	return err != nil && ctx.Err() != nil &&
		(errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded))
}

// Ended returns ctx.Err() in place of err if the end of ctx caused it (see
// Caused), and err as it is otherwise: nil, a broker error, a sentinel.
func Ended(ctx context.Context, err error) error {
	if Caused(ctx, err) {
		return ctx.Err()
	}
	return err
}

// After returns ctx.Err() in place of any error once ctx has ended, and err
// as it is otherwise. It is the rule of a call whose every step is bounded
// by ctx (a backend's Acquire, Init, Open, Delete): whatever step the end
// of ctx cut short, a channel closed under it or a round trip abandoned,
// the caller sees ctx.Err() itself.
func After(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil && err != nil {
		return cerr
	}
	return err
}

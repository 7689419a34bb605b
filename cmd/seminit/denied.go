// Permission refusals the broker reports beside the failing request.

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/tokensem/tokensem"
)

// refusals records the first permissions violation a NATS server reported
// on a connection of this run. The server reports a refused publish
// (a JetStream API request, a pull, an ack) asynchronously, and the request
// itself only times out: without this record the run would end in a
// timeout (exit 69) that hides the reason.
type refusals struct {
	mu    sync.Mutex
	first error
}

type refusalsKey struct{}

// withRefusals returns ctx carrying a new record, for connectNATS.
func withRefusals(ctx context.Context) (context.Context, *refusals) {
	r := &refusals{}
	return context.WithValue(ctx, refusalsKey{}, r), r
}

// natsErrorHandler reports nats.go's asynchronous errors through log
// (nats.go's default prints them on stderr, past --log-level and the
// redaction of secrets) and records permissions violations in ctx's
// refusals.
func natsErrorHandler(ctx context.Context, log *slog.Logger) nats.Option {
	r, _ := ctx.Value(refusalsKey{}).(*refusals)
	return nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
		attrs := []any{"err", err}
		if sub != nil {
			attrs = append(attrs, "subject", sub.Subject)
		}
		log.Warn("nats: the server reported an error", attrs...)
		if r != nil && errors.Is(err, nats.ErrPermissionViolation) {
			r.mu.Lock()
			if r.first == nil {
				r.first = err
			}
			r.mu.Unlock()
		}
	})
}

// explain turns a run's failure that looks like an unanswered request
// (exit 69 or 75, not exec's own --wait and conflict codes) into a
// permission denial (exit 77) when the broker refused a request of the run
// for the user's permissions: the refusal, which names the subject, is the
// reason.
func (r *refusals) explain(err error) error {
	if err == nil || errors.Is(err, tokensem.ErrPermissionDenied) {
		return err
	}
	r.mu.Lock()
	first := r.first
	r.mu.Unlock()
	var ec exitCodeErr
	if first == nil || errors.As(err, &ec) {
		return err
	}
	if code := exitCode(err); code != exitUnavailable && code != exitNoPermit {
		return err
	}
	return fmt.Errorf("%w: %w (then: %w)", tokensem.ErrPermissionDenied, first, err)
}

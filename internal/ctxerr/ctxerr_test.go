package ctxerr_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/ctxerr"
)

func TestEnded(t *testing.T) {
	live := context.Background()
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	// A broker call's own timeout, from a context of its own.
	inner := fmt.Errorf("natssem: reading the configuration of s: %w", context.DeadlineExceeded)
	broker := fmt.Errorf("amqpsem: open channel: %w", tokensem.ErrUnavailable)

	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want error
	}{
		{"nil", cancelled, nil, nil},
		{"cancelled, wrapped", cancelled, fmt.Errorf("a: b: %w", context.Canceled), context.Canceled},
		{"cancelled, bare", cancelled, context.Canceled, context.Canceled},
		{"cancelled, joined", cancelled, errors.Join(broker, context.Canceled), context.Canceled},
		{"expired, wrapped", expired, inner, context.DeadlineExceeded},
		// The caller cancelled as a round trip timed out: the caller's end wins.
		{"cancelled, inner timeout", cancelled, inner, context.Canceled},
		{"expired, broker error", expired, broker, broker},
		{"expired, sentinel", expired, tokensem.ErrClosed, tokensem.ErrClosed},
		{"live, inner timeout", live, inner, inner},
		{"live, canceled", live, context.Canceled, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ctxerr.Ended(tc.ctx, tc.err); got != tc.want {
				t.Fatalf("Ended = %v, want %v itself", got, tc.want)
			}
		})
	}
}

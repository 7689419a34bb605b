package semtest

import (
	"context"
	"log/slog"
	"sync"
)

// ReissueMessage is the message of the Debug record a backend logs when a
// waiting caller loses its place in the broker's queue of waiters and asks
// again at the back (natssem: its pull went silent, expired, or was ended
// by the server). FIFO order is not promised across such a loss, so the
// suite checks the order only in a run without one. A backend whose waiters
// never lose their place logs none.
const ReissueMessage = "waiting pull re-issued"

// reissues is a slog.Handler that counts ReissueMessage records, for a
// test to give its semaphores through Options.Logger. Its derived handlers
// (WithAttrs, WithGroup) count into the same tally.
type reissues struct{ *tally }

type tally struct {
	mu     sync.Mutex
	n      int
	reason string // the last record's "reason"
}

func newReissues() reissues { return reissues{&tally{}} }

// count returns how many re-issues were logged, and the last one's reason.
func (r reissues) count() (int, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n, r.reason
}

func (r reissues) Enabled(context.Context, slog.Level) bool { return true }

func (r reissues) Handle(_ context.Context, rec slog.Record) error {
	if rec.Message != ReissueMessage {
		return nil
	}
	reason := ""
	rec.Attrs(func(a slog.Attr) bool {
		if a.Key == "reason" {
			reason = a.Value.String()
			return false
		}
		return true
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n++
	r.reason = reason
	return nil
}

func (r reissues) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r reissues) WithGroup(string) slog.Handler      { return r }

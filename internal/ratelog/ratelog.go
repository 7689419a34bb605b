// Package ratelog logs a repeated warning at most once an interval, with
// how many were held back: for what a peer can make happen as often as it
// likes (a malformed message, say), which must not flood the log.
package ratelog

import (
	"log/slog"
	"sync"
	"time"
)

// Limited logs at most once every Every (default 10 s). Safe for
// concurrent use; the zero value is ready.
type Limited struct {
	Every time.Duration

	mu         sync.Mutex
	last       time.Time
	suppressed int
}

// Warn logs msg with args at Warn level, unless it logged less than Every
// ago; then it counts the call, and the next record says how many were
// held back ("suppressed").
func (l *Limited) Warn(log *slog.Logger, msg string, args ...any) {
	every := l.Every
	if every <= 0 {
		every = 10 * time.Second
	}
	l.mu.Lock()
	now := time.Now()
	if !l.last.IsZero() && now.Sub(l.last) < every {
		l.suppressed++
		l.mu.Unlock()
		return
	}
	n := l.suppressed
	l.last, l.suppressed = now, 0
	l.mu.Unlock()
	if n > 0 {
		args = append(args, "suppressed", n)
	}
	log.Warn(msg, args...)
}

// Package backoff paces the retries of the backends: a jittered pause that
// doubles from a minimum to a maximum, and a sleep that ends with its
// context.
package backoff

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/tokensem/tokensem"
)

// Backoff is the pause between retries: jittered, doubling from Min to Max.
// The zero value waits Min (0) every time; set Min and Max.
type Backoff struct {
	Min, Max time.Duration
	cur      time.Duration
}

// Reset starts the pauses over from Min.
func (b *Backoff) Reset() { b.cur = 0 }

// Wait sleeps the next pause: a random time in [p/2, p], where p doubles
// each call from Min up to Max. It returns ctx.Err() if ctx ends first, and
// tokensem.ErrClosed if stop (which may be nil) closes first.
func (b *Backoff) Wait(ctx context.Context, stop <-chan struct{}) error {
	b.cur = min(max(2*b.cur, b.Min), b.Max)
	t := time.NewTimer(b.cur/2 + rand.N(b.cur/2+1))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-stop:
		return tokensem.ErrClosed
	case <-t.C:
		return nil
	}
}

// Sleep sleeps d, or returns ctx.Err() when ctx ends first.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Retry runs step until it succeeds, fails with an error retryable rejects,
// ctx ends or stop closes, pausing by b between tries and telling onRetry
// (which may be nil) of each failure it retries. It returns step's last
// error.
func Retry(ctx context.Context, b Backoff, stop <-chan struct{}, retryable func(error) bool, onRetry func(error), step func() error) error {
	for {
		err := step()
		if err == nil || !retryable(err) || ctx.Err() != nil {
			return err
		}
		if onRetry != nil {
			onRetry(err)
		}
		if b.Wait(ctx, stop) != nil {
			return err
		}
	}
}

// Removal runs a removal through retry (a backend's Retry): a try whose
// removal landed although its answer was lost leaves nothing for the next
// try to find, so a later try that fails with gone (the backend's "does
// not exist") is a success, not an error.
func Removal(retry func(step func() error) error, gone error, remove func(removed *bool) error) error {
	removed := false
	err := retry(func() error { return remove(&removed) })
	if removed && errors.Is(err, gone) {
		return nil
	}
	return err
}

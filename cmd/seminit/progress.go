package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/term"

	"github.com/tokensem/tokensem"
)

// A reporter tells the user about long work on stderr: while exec waits
// for a permit, while delete --force waits out the holders' lease. It
// speaks only when stderr is a terminal, where it keeps one line up to
// date, or with --verbose, where it writes a line now and then; never into
// --json output (which goes to stdout). golang.org/x/term tells a terminal
// on every system seminit builds for, which a hand-written ioctl would not.
type reporter struct {
	w   io.Writer
	tty bool
}

// reporter returns the verb's reporter, nil when it is to stay quiet.
func (g *globals) reporter(e env) *reporter {
	f, ok := e.stderr.(*os.File)
	tty := ok && term.IsTerminal(int(f.Fd()))
	if !tty && !g.verbose {
		return nil
	}
	return &reporter{w: e.stderr, tty: tty}
}

// every calls line every second (a terminal) or ten (--verbose) from
// after a moment until stop, and shows what it returns; stop erases the
// terminal's line. A nil reporter does nothing.
func (r *reporter) every(ctx context.Context, line func(ctx context.Context, waited time.Duration) string) (stop func()) {
	if r == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		start := time.Now()
		first, period := 500*time.Millisecond, 10*time.Second
		if r.tty {
			period = time.Second
		}
		t := time.NewTimer(first)
		defer t.Stop()
		shown := false
		for {
			select {
			case <-ctx.Done():
				if shown && r.tty {
					fmt.Fprint(r.w, "\r\033[K")
				}
				return
			case <-t.C:
			}
			msg := line(ctx, time.Since(start).Round(time.Second))
			if ctx.Err() != nil {
				continue
			}
			if r.tty {
				fmt.Fprintf(r.w, "\r\033[K%s", msg)
			} else {
				fmt.Fprintln(r.w, msg)
			}
			shown = true
			t.Reset(period)
		}
	})
	return func() {
		cancel()
		wg.Wait()
	}
}

// during reports what is under way, and for how long, until stop: the
// progress of init, delete, resize and reconcile, which on a large
// semaphore take seconds (20,000 permits: about 13 s to create).
func (r *reporter) during(ctx context.Context, what string) (stop func()) {
	return r.every(ctx, func(_ context.Context, took time.Duration) string {
		return fmt.Sprintf("%s: %v", what, took)
	})
}

// waitLine is exec's line while it waits: for what, how long, and what
// the broker says of the semaphores (read every few seconds).
func waitLine(what string, sems []tokensem.Semaphore, timeout time.Duration) func(context.Context, time.Duration) string {
	var (
		counts string
		read   time.Time
	)
	return func(ctx context.Context, waited time.Duration) string {
		if time.Since(read) >= 3*time.Second {
			read = time.Now()
			var parts []string
			for _, s := range sems {
				c, ok := s.(tokensem.Counter)
				if !ok {
					continue
				}
				cctx, cancel := context.WithTimeout(ctx, timeout)
				n, err := c.Count(cctx)
				cancel()
				if err != nil {
					continue
				}
				name := ""
				if len(sems) > 1 {
					name = s.(interface{ Name() string }).Name() + ": "
				}
				parts = append(parts, fmt.Sprintf("%s%d of %d held, %d waiting with this one", name, n.Held, n.Permits, n.Waiting))
			}
			counts = strings.Join(parts, "; ")
		}
		msg := fmt.Sprintf("seminit exec: waiting %v for %s", waited, what)
		if counts != "" {
			msg += " (" + counts + ")"
		}
		return msg
	}
}

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/tokensem/tokensem/reconciler"
)

// resizer is a semaphore that can change its number of permits live.
type resizer interface {
	Resize(ctx context.Context, permits int) (reconciler.Report, error)
}

// runResize changes a semaphore's number of permits live: growing issues
// tokens for the new slots; shrinking retires slots >= M as their holders
// release them. It prints the reconcile report of the change and exits 0
// when the token set is healthy for the new count.
func runResize(ctx context.Context, e env, args []string) error {
	fs := flag.NewFlagSet("resize", flag.ContinueOnError)
	var g globals
	g.register(fs)
	name := fs.String("name", "", "semaphore name")
	permits := fs.Int("permits", 0, "new number of permits (M > 0)")
	step := fs.Int("step", 0, "change by at most K permits at a time (0, the default: all at once)")
	interval := fs.Duration("interval", 5*time.Second, "pause between steps (0: none)")
	if err := parse(fs, args, false); err != nil {
		return err
	}
	if *step < 0 || *interval < 0 {
		return usageErr{errors.New("--step and --interval must not be negative")}
	}
	if err := requireName(*name); err != nil {
		return err
	}
	if err := requirePermits(fs, *permits); err != nil {
		return err
	}
	s, done, err := openSemaphore(ctx, &g, *name)
	if err != nil {
		return err
	}
	defer done()
	rs, ok := s.(resizer)
	if !ok {
		return usageErr{errors.New("this backend cannot resize")}
	}
	current := *permits
	if p, ok := s.(interface{ Permits() int }); ok {
		current = p.Permits()
	}
	for {
		next := stepToward(current, *permits, *step)
		rctx, cancel := context.WithTimeout(ctx, g.opTimeout())
		r, err := rs.Resize(rctx, next)
		cancel()
		if err != nil {
			return classify(err)
		}
		printReport(e, &g, *name, r)
		if !r.Healthy {
			return exitCodeErr{code: exitFailure, err: fmt.Errorf("%s is not healthy after resizing to %d", *name, next)}
		}
		if current = next; current == *permits {
			return nil
		}
		select {
		case <-ctx.Done():
			return exitCodeErr{code: signalExit(ctx), err: fmt.Errorf("interrupted at %d permits", current)}
		case <-time.After(*interval):
		}
	}
}

// stepToward moves from by at most step (0: no limit) toward to.
func stepToward(from, to, step int) int {
	switch {
	case step <= 0, from == to:
		return to
	case to > from:
		return min(to, from+step)
	default:
		return max(to, from-step)
	}
}

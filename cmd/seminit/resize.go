package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
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
		stop := g.reporter(e).during(rctx, fmt.Sprintf("seminit resize: %s from %d to %d permits", *name, current, next))
		r, err := rs.Resize(rctx, next)
		stop()
		cancel()
		if err != nil {
			return classify(err)
		}
		printResize(e, &g, *name, current, next, r)
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

// printResize reports one step of a resize from permits from to to: the
// tokens a growth issued and a shrink retired in their own words, and only
// what else the repair found as damage. --json prints the report as
// reconcile does.
func printResize(e env, g *globals, name string, from, to int, r reconciler.Report) {
	if g.json {
		printReport(e, g, name, r)
		return
	}
	var grown, damaged []int // slots issued for the growth; slots missing below it
	for _, i := range r.Missing {
		if i >= from {
			grown = append(grown, i)
		} else {
			damaged = append(damaged, i)
		}
	}
	retired := 0
	if to < from {
		retired = min(r.Invalid, from-to)
	}
	var b strings.Builder
	switch {
	case to > from:
		fmt.Fprintf(&b, "%s: grew from %d to %s", name, from, permitCount(to))
		if len(grown) > 0 {
			fmt.Fprintf(&b, ": issued tokens for %s", slotList(grown))
		}
	case to < from:
		fmt.Fprintf(&b, "%s: shrank from %d to %s: retired %d free tokens of slots %d and up (held ones retire as their holders release them)",
			name, from, permitCount(to), retired, to)
	default:
		fmt.Fprintf(&b, "%s: already has %s", name, permitCount(to))
	}
	var repaired []string
	if len(damaged) > 0 {
		repaired = append(repaired, "reissued lost tokens of "+slotList(damaged))
	}
	if len(r.Duplicates) > 0 {
		repaired = append(repaired, "removed duplicate tokens of "+slotList(r.Duplicates))
	}
	if junk := r.Invalid - retired; junk > 0 {
		repaired = append(repaired, fmt.Sprintf("removed %d invalid messages", junk))
	}
	if len(repaired) > 0 {
		fmt.Fprintf(&b, "; also repaired: %s", strings.Join(repaired, ", "))
	}
	if !r.Healthy {
		b.WriteString("; not healthy after the repair (seminit status shows why)")
	}
	fmt.Fprintln(e.stdout, b.String())
}

// permitCount is "1 permit" or "N permits".
func permitCount(n int) string {
	if n == 1 {
		return "1 permit"
	}
	return strconv.Itoa(n) + " permits"
}

// slotList writes slot indices as "slot 0" or "slots 0, 1, 2".
func slotList(slots []int) string {
	s := make([]string, len(slots))
	for i, v := range slots {
		s[i] = strconv.Itoa(v)
	}
	if len(s) == 1 {
		return "slot " + s[0]
	}
	return "slots " + strings.Join(s, ", ")
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

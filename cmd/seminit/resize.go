package main

import (
	"context"
	"errors"
	"flag"
	"fmt"

	"github.com/tokensem/tokensem"
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
	if err := parse(fs, args, false); err != nil {
		return err
	}
	if err := requireName(*name); err != nil {
		return err
	}
	if err := tokensem.ValidatePermits(*permits); err != nil {
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
	rctx, cancel := context.WithTimeout(ctx, g.opTimeout())
	defer cancel()
	r, err := rs.Resize(rctx, *permits)
	if err != nil {
		return classify(err)
	}
	printReport(e, &g, *name, r)
	if !r.Healthy {
		return exitCodeErr{code: exitFailure, err: fmt.Errorf("%s is not healthy after the resize", *name)}
	}
	return nil
}

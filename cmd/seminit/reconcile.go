package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/amqpsem"
	"github.com/tokensem/tokensem/driver"
	"github.com/tokensem/tokensem/internal/redact"
	"github.com/tokensem/tokensem/natssem"
	"github.com/tokensem/tokensem/reconciler"
	"github.com/tokensem/tokensem/semmetrics"
)

// runReconcile takes a census of a semaphore and, with --repair, repairs
// duplicates, losses and invalid tokens. It exits 0 when the semaphore is
// healthy after the run and 1 when not. With --watch it runs every
// INTERVAL until SIGINT/SIGTERM.
func runReconcile(ctx context.Context, e env, args []string) error {
	fs := flag.NewFlagSet("reconcile", flag.ContinueOnError)
	var g globals
	g.register(fs)
	name := fs.String("name", "", "semaphore name")
	repair := fs.Bool("repair", false, "repair what the census finds (default: report only)")
	watch := fs.Duration("watch", 0, "run every INTERVAL until interrupted")
	metricsAddr := fs.String("metrics-listen", "", "with --watch: serve Prometheus metrics at http://ADDR/metrics")
	if err := parse(fs, args, false); err != nil {
		return err
	}
	if err := requireName(*name); err != nil {
		return err
	}
	if *watch < 0 {
		return usageErr{errors.New("--watch must not be negative")}
	}
	if isSet(fs, "watch") && *watch == 0 {
		return usageErr{errors.New("--watch 0: want a positive interval (leave --watch out to run once)")}
	}
	if *metricsAddr != "" && *watch == 0 {
		return usageErr{errors.New("--metrics-listen needs --watch")}
	}
	s, done, err := openSemaphore(ctx, &g, *name)
	if err != nil {
		return err
	}
	defer done()
	inv, ok := inventoryOf(s)
	if !ok {
		return usageErr{fmt.Errorf("reconcile is not available for %s yet", redact.URL(g.url))}
	}
	if *watch > 0 {
		var m *semmetrics.Metrics
		if *metricsAddr != "" {
			reg := newRegistry()
			if m, err = semmetrics.New(reg); err != nil {
				return err
			}
			stop, err := serveMetrics(ctx, e, *metricsAddr, reg)
			if err != nil {
				return err
			}
			defer stop()
		}
		counter, _ := s.(tokensem.Counter)
		err := reconciler.Watch(ctx, inv, *watch, *repair, func(r reconciler.Report, err error) {
			if m != nil {
				m.ObserveReport(*name, r, err)
				if counter != nil {
					cctx, cancel := context.WithTimeout(ctx, g.opTimeout())
					if c, err := counter.Count(cctx); err == nil {
						m.ObserveCount(*name, c)
					}
					cancel()
				}
			}
			if err != nil {
				e.warnf("seminit reconcile: %v\n", err)
				return
			}
			printReport(e, &g, *name, r)
		})
		if ctx.Err() != nil {
			return nil // interrupted: the normal end of a watch
		}
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, g.opTimeout())
	defer cancel()
	what := "seminit reconcile: counting the tokens of " + *name
	if *repair {
		what = "seminit reconcile: counting and repairing the tokens of " + *name
	}
	stop := g.reporter(e).during(rctx, what)
	r, err := reconciler.Run(rctx, inv, *repair)
	stop()
	if err != nil {
		return classify(err)
	}
	printReport(e, &g, *name, r)
	if !r.Healthy {
		if !*repair {
			return exitCodeErr{code: exitFailure, err: fmt.Errorf("%s is not healthy; to repair it: seminit reconcile --repair --name %s", *name, *name)}
		}
		return exitCodeErr{code: exitFailure, err: fmt.Errorf("%s is still not healthy after the repair (what no repair fixes: seminit status --name %s)", *name, *name)}
	}
	return nil
}

// inventoryOf returns the reconciler's view of s, for backends that have
// one.
func inventoryOf(s tokensem.Semaphore) (driver.Inventory, bool) {
	switch s := s.(type) {
	case *natssem.Semaphore:
		return s.Inventory(), true
	case *amqpsem.Semaphore:
		return s.Inventory(), true
	default:
		return nil, false
	}
}

func printReport(e env, g *globals, name string, r reconciler.Report) {
	if g.json {
		e.printJSON(struct {
			Name string `json:"name"`
			reconciler.Report
		}{name, r})
		return
	}
	fmt.Fprintf(e.stdout, "%s: %d permits, %d token messages; duplicates %v, missing %v, invalid %d; removed %d, issued %d; healthy=%v (census %v, repair %v)\n",
		name, r.Permits, r.Tokens, r.Duplicates, r.Missing, r.Invalid, r.Removed, r.Issued, r.Healthy,
		r.Census.Round(time.Millisecond), r.Repair.Round(time.Millisecond))
	if gr := r.Gate; gr != nil {
		fmt.Fprintf(e.stdout, "%s's gate (weighted callers take turns through it): %d token messages; duplicates %v, missing %v, invalid %d; removed %d, issued %d; healthy=%v\n",
			name, gr.Tokens, gr.Duplicates, gr.Missing, gr.Invalid, gr.Removed, gr.Issued, gr.Healthy)
	}
}

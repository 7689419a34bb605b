package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/redact"
)

type statuser interface {
	Status(ctx context.Context) (tokensem.Status, error)
}

// runStatus prints the census of an existing semaphore.
func runStatus(ctx context.Context, e env, args []string) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	var g globals
	g.register(fs)
	name := fs.String("name", "", "semaphore name")
	count := fs.Bool("count", false, "print only the cheap count (available, held, waiting) from the broker's counters, without a census")
	watch := fs.Duration("watch", 0, "refresh every INTERVAL until interrupted: counts, utilization over the last minute, and (NATS) holders with how long each has held")
	if err := parse(fs, args, false); err != nil {
		return err
	}
	if *watch < 0 || isSet(fs, "watch") && *watch == 0 {
		return usageErr{errors.New("--watch: want a positive interval")}
	}
	if err := requireName(*name); err != nil {
		return err
	}
	s, done, err := openSemaphore(ctx, &g, *name)
	if err != nil {
		return err
	}
	defer done()
	if *watch > 0 {
		return watchStatus(ctx, e, &g, s, *name, *watch)
	}
	if *count {
		return printCount(ctx, e, &g, s, *name)
	}
	return printStatus(ctx, e, &g, s, "status")
}

// printCount prints a tokensem.Count of s.
func printCount(ctx context.Context, e env, g *globals, s tokensem.Semaphore, name string) error {
	counter, ok := s.(tokensem.Counter)
	if !ok {
		return usageErr{fmt.Errorf("--count is not available for %s", redact.URL(g.url))}
	}
	cctx, cancel := context.WithTimeout(ctx, g.opTimeout())
	defer cancel()
	c, err := counter.Count(cctx)
	if err != nil {
		return classify(err)
	}
	if g.json {
		e.printJSON(struct {
			Name string `json:"name"`
			tokensem.Count
		}{name, c})
		return nil
	}
	fmt.Fprintf(e.stdout, "%s: %d permits, available %d, held %d, waiting %d\n", name, c.Permits, c.Available, c.Held, c.Waiting)
	return nil
}

// openSemaphore connects to the broker and opens semaphore name, bounded by
// the operation timeout. done closes both.
func openSemaphore(ctx context.Context, g *globals, name string) (s tokensem.Semaphore, done func(), err error) {
	sems, done, err := openSemaphores(ctx, g, []string{name})
	if err != nil {
		return nil, nil, err
	}
	return sems[0], done, nil
}

// openSemaphores opens the semaphores names through one connection.
func openSemaphores(ctx context.Context, g *globals, names []string) (sems []tokensem.Semaphore, done func(), err error) {
	return openOrInit(ctx, g, names, 0, 0)
}

// openOrInit opens the semaphores names, or, when permits is above 0,
// creates each with that many permits (and lease, if not 0) unless it
// exists (init's rules: a different count is a mismatch).
func openOrInit(ctx context.Context, g *globals, names []string, permits int, lease time.Duration) (sems []tokensem.Semaphore, done func(), err error) {
	key, err := g.key()
	if err != nil {
		return nil, nil, err
	}
	octx, cancel := context.WithTimeout(ctx, g.opTimeout())
	defer cancel()
	b, err := connect(octx, g)
	if err != nil {
		return nil, nil, err
	}
	done = func() {
		for _, s := range sems {
			_ = s.Close()
		}
		b.close()
	}
	for _, name := range names {
		o := semOptions{key: key, timeout: g.requestTimeout(), log: g.logger()}
		var s tokensem.Semaphore
		if permits > 0 {
			o.lease = lease
			s, err = b.init(octx, name, permits, o)
		} else {
			s, err = b.open(octx, name, o)
		}
		if err != nil {
			done()
			return nil, nil, err
		}
		sems = append(sems, s)
	}
	return sems, done, nil
}

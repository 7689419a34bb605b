package main

import (
	"context"
	"flag"

	"github.com/tokensem/tokensem"
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
	if err := parse(fs, args, false); err != nil {
		return err
	}
	if err := requireName(*name); err != nil {
		return err
	}
	s, done, err := openSemaphore(ctx, &g, *name)
	if err != nil {
		return err
	}
	defer done()
	return printStatus(ctx, e, &g, s, "status")
}

// openSemaphore connects to the broker and opens semaphore name, bounded by
// the operation timeout. done closes both.
func openSemaphore(ctx context.Context, g *globals, name string) (s tokensem.Semaphore, done func(), err error) {
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
	s, err = b.open(octx, name, semOptions{key: key, timeout: g.requestTimeout(), log: g.logger()})
	if err != nil {
		b.close()
		return nil, nil, err
	}
	return s, func() { _ = s.Close(); b.close() }, nil
}

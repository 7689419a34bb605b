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
	key, err := g.key()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, g.opTimeout())
	defer cancel()
	b, err := connect(ctx, &g)
	if err != nil {
		return err
	}
	defer b.close()
	s, err := b.open(ctx, *name, semOptions{key: key, timeout: g.timeout})
	if err != nil {
		return err
	}
	defer s.Close()
	return printStatus(ctx, e, &g, s, "status")
}

package main

import (
	"context"
	"flag"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/tokensem/tokensem"
)

// runList prints the semaphores of the broker. One whose configuration is
// invalid is listed with state "invalid" and the reason on stderr (in
// --json, its "warning"); the list still succeeds.
func runList(ctx context.Context, e env, args []string) error {
	fs := flag.NewFlagSet("list", flag.ContinueOnError)
	var g globals
	g.register(fs)
	if err := parse(fs, args, false); err != nil {
		return err
	}
	octx, cancel := context.WithTimeout(ctx, g.opTimeout())
	defer cancel()
	b, err := connect(octx, &g)
	if err != nil {
		return err
	}
	defer b.close()
	infos, err := b.list(octx)
	if err != nil {
		return err
	}
	if g.json {
		if infos == nil {
			infos = []tokensem.Info{} // [] rather than null
		}
		e.printJSON(infos)
		return nil
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tPERMITS\tLEASE\tSTATE")
	for _, in := range infos {
		lease := "-"
		if in.Lease > 0 {
			lease = in.Lease.Round(time.Millisecond).String()
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", in.Name, in.Permits, lease, in.State)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, in := range infos {
		if in.Warning != "" {
			e.warnf("seminit: %s: %s\n", in.Name, in.Warning)
		}
	}
	return nil
}

// runDelete deletes a semaphore: refused (exit 75) while a permit is held,
// unless --force, which takes every holder's permit (exec exits 70).
func runDelete(ctx context.Context, e env, args []string) error {
	fs := flag.NewFlagSet("delete", flag.ContinueOnError)
	var g globals
	g.register(fs)
	name := fs.String("name", "", "semaphore name")
	force := fs.Bool("force", false, "delete even while permits are held: their holders lose them")
	if err := parse(fs, args, false); err != nil {
		return err
	}
	if err := requireName(*name); err != nil {
		return err
	}
	octx, cancel := context.WithTimeout(ctx, g.opTimeout())
	defer cancel()
	b, err := connect(octx, &g)
	if err != nil {
		return err
	}
	defer b.close()
	var stop func()
	if *force {
		until, _ := octx.Deadline()
		stop = g.reporter(e).every(octx, func(_ context.Context, took time.Duration) string {
			return fmt.Sprintf("seminit delete: %v: waiting for the holders of %s to learn it is deleted (a lease on NATS; until %s at most)",
				took, *name, until.Format("15:04:05"))
		})
	} else {
		stop = g.reporter(e).during(octx, "seminit delete: deleting "+*name)
	}
	err = b.delete(octx, *name, *force)
	stop()
	if err != nil {
		return err
	}
	if g.json {
		e.printJSON(struct {
			Name    string `json:"name"`
			Deleted bool   `json:"deleted"`
		}{*name, true})
		return nil
	}
	fmt.Fprintf(e.stdout, "%s deleted\n", *name)
	return nil
}

package main

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/tokensem/tokensem"
)

// runInit creates a semaphore, or checks an existing one has the same
// number of permits, and prints its status.
func runInit(ctx context.Context, e env, args []string) error {
	fs := flag.NewFlagSet("init", flag.ContinueOnError)
	var g globals
	g.register(fs)
	name := fs.String("name", "", "semaphore name")
	permits := fs.Int("permits", 0, "number of permits (N > 0)")
	lease := fs.Duration("lease", 0, fmt.Sprintf("holder lease, positive (default %v)", tokensem.DefaultLease))
	replicas := fs.Int("replicas", 0, "stream and KV replicas: 1 or 3 (default 1)")
	if err := parse(fs, args, false); err != nil {
		return err
	}
	// 0 would silently mean the default: say so instead.
	if isSet(fs, "lease") && *lease <= 0 {
		return usageErr{fmt.Errorf("--lease %v: want a positive duration (leave --lease out for the default, %v)", *lease, tokensem.DefaultLease)}
	}
	if isSet(fs, "replicas") && *replicas <= 0 {
		return usageErr{fmt.Errorf("--replicas %d: want 1 or 3 (leave --replicas out for 1)", *replicas)}
	}
	if err := requireName(*name); err != nil {
		return err
	}
	if err := requirePermits(fs, *permits); err != nil {
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
	stop := g.reporter(e).during(ctx, fmt.Sprintf("seminit init: creating %s with %d tokens", *name, *permits))
	s, err := b.init(ctx, *name, *permits, semOptions{lease: *lease, replicas: *replicas, key: key, timeout: g.requestTimeout(), log: g.logger()})
	stop()
	if err != nil {
		return err
	}
	defer s.Close()
	return printStatus(ctx, e, &g, s, "ready")
}

// printStatus prints a semaphore's census.
func printStatus(ctx context.Context, e env, g *globals, s statuser, verb string) error {
	sctx, cancel := context.WithTimeout(ctx, 3*g.timeout)
	defer cancel()
	st, err := s.Status(sctx)
	if err != nil {
		return classify(err)
	}
	var ctl *controllerView
	if verb == "status" {
		ctl = readController(sctx, g, s)
	}
	if g.json {
		e.printJSON(struct {
			tokensem.Status
			Controller *controllerView `json:"controller,omitempty"`
		}{st, ctl})
		return nil
	}
	lease := st.Lease.Round(time.Millisecond).String()
	if st.Lease == 0 {
		lease = "held until the holder's connection drops"
	}
	fmt.Fprintf(e.stdout, "%s %s: %d permits (%s %s, lease %s, epoch %d)\n",
		st.Name, verb, st.Permits, st.Backend, st.Resource, lease, st.Epoch)
	fmt.Fprintf(e.stdout, "  tokens %d, available %d, held %d, waiting %d\n", st.Tokens, st.Available, st.Held, st.Waiting)
	health := "healthy"
	if !st.Healthy {
		health = fmt.Sprintf("UNHEALTHY: duplicates %v, missing %v, invalid %d", st.Duplicate, st.Missing, st.Invalid)
	}
	fmt.Fprintf(e.stdout, "  %s\n", health)
	for _, h := range st.Holders {
		if h.Owner == "" {
			fmt.Fprintf(e.stdout, "  slot %d held\n", h.Index)
		} else {
			fmt.Fprintf(e.stdout, "  slot %d held by %s (renewed %s)\n", h.Index, h.Owner, h.Since.Format(time.RFC3339))
		}
	}
	for _, w := range st.Warnings {
		fmt.Fprintf(e.stdout, "  warning: %s\n", w)
	}
	ctl.print(e.stdout)
	return nil
}

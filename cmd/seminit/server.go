package main

import (
	"context"
	"flag"
	"fmt"
	"net"

	"github.com/tokensem/tokensem/natssem/embedded"
)

// runServer runs an embedded NATS JetStream server until ctx ends
// (SIGINT/SIGTERM).
func runServer(ctx context.Context, e env, args []string) error {
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:4222", "host:port to listen on")
	store := fs.String("store", "", "JetStream store directory (default: a temporary one, removed on exit)")
	if err := parse(fs, args, false); err != nil {
		return err
	}
	if _, _, err := net.SplitHostPort(*listen); err != nil {
		return usageErr{fmt.Errorf("--listen %q: %w", *listen, err)}
	}
	srv, err := embedded.Start(embedded.Config{Listen: *listen, StoreDir: *store})
	if err != nil {
		return unavailableErr{err}
	}
	defer srv.Shutdown()
	where := srv.StoreDir()
	if *store == "" {
		where += " (temporary; --store DIR keeps it)"
	}
	fmt.Fprintf(e.stdout, "seminit: NATS JetStream listening on %s, store %s\n", srv.URL(), where)
	<-ctx.Done()
	fmt.Fprintln(e.stdout, "seminit: shutting down")
	return nil
}

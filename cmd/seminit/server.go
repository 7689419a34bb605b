package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"

	"github.com/tokensem/tokensem/natssem/embedded"
)

// runServer runs an embedded NATS JetStream server until ctx ends
// (SIGINT/SIGTERM).
func runServer(ctx context.Context, e env, args []string) error {
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:4222", "host:port to listen on")
	store := fs.String("store", "", "JetStream store directory (default: a temporary one, removed on exit)")
	user := fs.String("user", "", "require this user name (with --password)")
	password := fs.String("password", "", "the user's password (else $TOKENSEM_PASSWORD)")
	tlsCert := fs.String("tls-cert", "", "serve TLS with this PEM certificate (with --tls-key)")
	tlsKey := fs.String("tls-key", "", "PEM key of --tls-cert")
	tlsCA := fs.String("tls-ca", "", "require client certificates signed by these PEM CAs")
	metricsAddr := fs.String("metrics-listen", "", "serve Prometheus metrics at http://ADDR/metrics")
	if err := parse(fs, args, false); err != nil {
		return err
	}
	if _, _, err := net.SplitHostPort(*listen); err != nil {
		return usageErr{fmt.Errorf("--listen %q: %w", *listen, err)}
	}
	cfg := embedded.Config{Listen: *listen, StoreDir: *store}

	pass, passSource := *password, "--password"
	if pass == "" {
		pass, passSource = os.Getenv("TOKENSEM_PASSWORD"), "$TOKENSEM_PASSWORD"
	}
	switch {
	case *user != "" && pass == "":
		return usageErr{errors.New("--user needs a password: --password or $TOKENSEM_PASSWORD")}
	case *user == "" && *password != "":
		return usageErr{errors.New("--password needs --user")}
	case *user != "":
		cfg.User, cfg.Password = *user, pass
	}

	if *tlsCert != "" || *tlsKey != "" || *tlsCA != "" {
		if *tlsCert == "" || *tlsKey == "" {
			return usageErr{errors.New("serving TLS needs both --tls-cert and --tls-key")}
		}
		tc, err := loadTLS(*tlsCA, *tlsCert, *tlsKey)
		if err != nil {
			return err
		}
		if *tlsCA != "" {
			// On a server the CAs verify clients, not the server itself.
			tc.ClientCAs, tc.RootCAs = tc.RootCAs, nil
			tc.ClientAuth = tls.RequireAndVerifyClientCert
		}
		cfg.TLS = tc
	}

	srv, err := embedded.Start(cfg)
	if err != nil {
		return unavailableErr{err}
	}
	defer srv.Shutdown()
	where := srv.StoreDir()
	if *store == "" {
		where += " (temporary; --store DIR keeps it)"
	}
	var extra string
	if cfg.User != "" {
		extra += fmt.Sprintf(", user %s (password from %s)", cfg.User, passSource)
	}
	if cfg.TLS != nil && cfg.TLS.ClientAuth == tls.RequireAndVerifyClientCert {
		extra += ", client certificates required"
	}
	fmt.Fprintf(e.stdout, "seminit: NATS JetStream listening on %s, store %s%s\n", srv.URL(), where, extra)
	if *metricsAddr != "" {
		reg := newRegistry()
		reg.MustRegister(newNATSCollector(srv.NATS()))
		stop, err := serveMetrics(ctx, e, *metricsAddr, reg)
		if err != nil {
			return err
		}
		defer stop()
	}
	<-ctx.Done()
	fmt.Fprintln(e.stdout, "seminit: shutting down")
	return nil
}

package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/tokensem/tokensem/natssem/embedded"
)

// runServer runs an embedded NATS JetStream server, standalone or as one
// node of a cluster, until ctx ends (SIGINT/SIGTERM).
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
	var sync embedded.SyncPolicy
	fs.TextVar(&sync, "sync", embedded.SyncDefault, "when to fsync: always or interval (default: always with --store)")
	syncEvery := fs.Duration("sync-interval", 0, "fsync period of --sync interval (default 2m)")
	serverName := fs.String("server-name", "", "server name, unique in the cluster")
	clusterListen := fs.String("cluster-listen", "", "host:port to accept cluster routes on; makes this a cluster node")
	routes := fs.String("routes", "", "comma-separated nats-route://host:port of the cluster's nodes")
	clusterName := fs.String("cluster-name", "", "cluster name (default "+embedded.DefaultClusterName+")")
	insecure := fs.Bool("insecure-no-auth", false, "allow --listen off loopback without --user or --tls-ca, and --cluster-listen off loopback (routes are never authenticated); warns")
	if err := parse(fs, args, false); err != nil {
		return err
	}
	if isSet(fs, "sync-interval") && *syncEvery <= 0 {
		return usageErr{fmt.Errorf("--sync-interval %v: want a positive duration (leave it out for %v)", *syncEvery, embedded.DefaultSyncEvery)}
	}
	listenHost, _, err := net.SplitHostPort(*listen)
	if err != nil {
		return usageErr{fmt.Errorf("--listen %q: %w", *listen, err)}
	}
	cfg := embedded.Config{Listen: *listen, StoreDir: *store, Sync: sync, SyncEvery: *syncEvery,
		ServerName: *serverName, ClusterListen: *clusterListen, ClusterName: *clusterName}
	if *routes != "" {
		for r := range strings.SplitSeq(*routes, ",") {
			cfg.Routes = append(cfg.Routes, strings.TrimSpace(r))
		}
	}

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

	if err := checkExposure(e, listenHost, *clusterListen, cfg.User != "" || *tlsCA != "", *insecure); err != nil {
		return err
	}

	srv, err := embedded.Start(cfg)
	if errors.Is(err, embedded.ErrInvalidConfig) {
		return usageErr{err}
	}
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
	switch policy, every := srv.Sync(); policy {
	case embedded.SyncInterval:
		extra += fmt.Sprintf(", fsync every %v", every)
	default:
		extra += ", fsync always"
	}
	if cfg.ClusterListen != "" {
		// JetStream answers once a majority of the nodes has elected a
		// meta leader; the line says so, and a second one says when.
		extra += fmt.Sprintf(", cluster %s node %s at %s; JetStream waits for a meta leader",
			cmp.Or(cfg.ClusterName, embedded.DefaultClusterName), srv.Name(), srv.ClusterURL())
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
	if cfg.ClusterListen != "" {
		if leader, err := srv.WaitJetStream(ctx); err == nil {
			fmt.Fprintf(e.stdout, "seminit: JetStream ready, meta leader %s\n", leader)
		}
	}
	<-ctx.Done()
	fmt.Fprintln(e.stdout, "seminit: shutting down")
	return nil
}

// checkExposure refuses a server that anyone on the network could use
// without credentials: --listen off loopback with no client authentication
// (--user, or client certificates with --tls-ca), and --cluster-listen off
// loopback (cluster routes are not authenticated: a stranger could join as
// a node and read every message). --insecure-no-auth allows both, with a
// warning on stderr: an init container binding 0.0.0.0 inside a pod whose
// network policy is the guard says so once, in its manifest.
func checkExposure(e env, listenHost, clusterListen string, clientAuth, insecure bool) error {
	var open []string
	if !clientAuth && !isLoopback(listenHost) {
		open = append(open, fmt.Sprintf("--listen %s takes clients without credentials (give --user/--password or --tls-ca)", cmp.Or(listenHost, "(every address)")))
	}
	if clusterListen != "" {
		// One that does not parse is embedded.Start's to report.
		if host, _, err := net.SplitHostPort(clusterListen); err == nil && !isLoopback(host) {
			open = append(open, fmt.Sprintf("--cluster-listen %s takes routes from any node (cluster routes are not authenticated)", cmp.Or(host, "(every address)")))
		}
	}
	if len(open) == 0 {
		return nil
	}
	what := strings.Join(open, "; ")
	if !insecure {
		return usageErr{fmt.Errorf("%s: anyone who can reach it can read, take and delete every semaphore. Bind to loopback, or, on a network only trusted hosts reach, say so with --insecure-no-auth", what)}
	}
	e.warnf("seminit: warning: --insecure-no-auth: %s: anyone who can reach it can read, take and delete every semaphore\n", what)
	return nil
}

// isLoopback reports whether host, from a host:port to listen on, is a
// loopback address: a literal one, or "localhost". Any other name, and ""
// (every address), is not.
func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

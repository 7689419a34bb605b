package embedded

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// ErrInvalidConfig is wrapped by every error Start returns for a Config
// (or server options) that cannot work, as opposed to a server that
// could not start.
var ErrInvalidConfig = errors.New("embedded: invalid configuration")

// Defaults of Config.
const (
	// DefaultClusterName is the cluster a node joins when ClusterListen
	// is set and ClusterName is not.
	DefaultClusterName = "tokensem"
	// DefaultSyncEvery is the fsync period of SyncInterval when SyncEvery
	// is zero: nats-server's own default (sync_interval: 2m).
	DefaultSyncEvery = 2 * time.Minute
	// DefaultReadyTimeout bounds Start's wait for the listeners.
	DefaultReadyTimeout = 10 * time.Second
)

// Config configures an embedded server. The zero Config is a standalone
// server on a random loopback port with its store in a new temporary
// directory that Shutdown removes.
type Config struct {
	// Listen is host:port; port 0 picks a free one. Default "127.0.0.1:0".
	Listen string
	// StoreDir holds the JetStream store. Empty: a temporary directory,
	// removed by Shutdown.
	StoreDir string
	// ServerName names the server (default: a generated one). A cluster
	// node needs one, unique in its cluster: JetStream names stream and
	// meta leaders by it.
	ServerName string
	// User and Password, when User is set, are the only credentials the
	// server accepts. Default: no authentication.
	User, Password string
	// TLS, when set, makes the server require TLS with this configuration
	// (URL then returns tls://host:port). A ClientAuth of
	// tls.RequireAndVerifyClientCert also makes it require client
	// certificates. Default: plaintext.
	TLS *tls.Config

	// Sync chooses when JetStream fsyncs its store; see SyncPolicy. The
	// zero value, SyncDefault, is SyncAlways for a StoreDir you give and
	// SyncInterval for a temporary store, which nothing reopens after a
	// crash, so an fsync would buy it nothing.
	//
	// Why SyncAlways for a kept store: with SyncInterval a power loss or
	// OS crash can roll back acknowledged token and lease-record writes,
	// which can duplicate or lose tokens and hand out a fencing number
	// twice; the reconciler can restore tokens, not fences. What it costs,
	// measured on a 2-core VM with an ext4 virtio disk (BenchmarkSync,
	// nats-server 2.15.2, means of 3 runs beside other load): one write
	// costs about 1 ms instead of 0.05 ms on one server (publish+ack
	// 0.83-1.05 ms vs 0.05-0.06 ms, KV update 0.71-1.26 ms vs 0.05 ms) and
	// about 2 ms instead of 0.2 ms on a 3-node cluster on one machine; a
	// natssem Acquire+Release takes 1.3-2.4 ms vs 0.2 ms (R1) and 7-11 ms
	// vs 1.1 ms (R3). That still turns one permit over hundreds of times a
	// second, far more than work guarded by a distributed semaphore needs.
	Sync SyncPolicy
	// SyncEvery is the fsync period under SyncInterval. Default
	// DefaultSyncEvery (2m). Setting it with another policy is an error.
	SyncEvery time.Duration

	// ClusterListen, when set, makes the server one node of a NATS
	// cluster: host:port where it accepts routes from the other nodes
	// (port 0 picks a free one; ClusterURL tells which). A cluster node
	// needs a ServerName, Routes and its own StoreDir: a temporary store
	// would rejoin the cluster empty after a restart, the truncated-files
	// case in which Jepsen saw NATS roll back. JetStream answers only once
	// a meta leader is elected, which needs a majority of the nodes:
	// see WaitJetStream.
	ClusterListen string
	// ClusterName names the cluster; every node must use the same.
	// Default DefaultClusterName ("tokensem").
	ClusterName string
	// Routes are the cluster URLs of the other nodes,
	// nats-route://host:port; a cluster node needs at least one (its own
	// may be among them: the server ignores a route to itself, so every
	// node can be given the same list). Routes need ClusterListen.
	Routes []string

	// Options, if set, is called with the server options before start
	// (after every field above is applied), for settings Config does not
	// offer.
	Options func(*server.Options) error
	// ReadyTimeout bounds the wait for the server to accept connections.
	// Default DefaultReadyTimeout (10s).
	ReadyTimeout time.Duration
}

// SyncPolicy says when JetStream fsyncs its store to disk. It applies to
// stream data, KV buckets (which are streams), consumer state and, in a
// cluster, the Raft logs. Without an fsync a write sits in the OS page
// cache: it survives the server process dying (kill -9) but not a power
// loss or OS crash.
type SyncPolicy int

const (
	// SyncDefault is SyncAlways when Config.StoreDir is set, SyncInterval
	// when the store is temporary.
	SyncDefault SyncPolicy = iota
	// SyncAlways fsyncs every write before it is acknowledged
	// (nats-server: sync_interval: always, Options.SyncAlways). On a
	// replicated stream nats-server fsyncs the Raft log on every append and
	// the stream's own files when it snapshots.
	SyncAlways
	// SyncInterval fsyncs in the background every Config.SyncEvery
	// (nats-server: sync_interval: DUR, Options.SyncInterval; its default,
	// 2 minutes). Writes acknowledged within the last period can be lost
	// on power loss or OS crash; Jepsen's 2025 analysis of NATS lost
	// acknowledged writes that way, and on a cluster whose nodes share the
	// power (three nodes on one machine) replication does not save them.
	SyncInterval
)

// String returns "always", "interval" or "default".
func (p SyncPolicy) String() string {
	switch p {
	case SyncAlways:
		return "always"
	case SyncInterval:
		return "interval"
	case SyncDefault:
		return "default"
	}
	return "SyncPolicy(" + strconv.Itoa(int(p)) + ")"
}

// UnmarshalText accepts "always" and "interval" (for flag.TextVar).
func (p *SyncPolicy) UnmarshalText(b []byte) error {
	switch string(b) {
	case "always":
		*p = SyncAlways
	case "interval":
		*p = SyncInterval
	default:
		return fmt.Errorf("%w: sync policy %q: want always or interval", ErrInvalidConfig, b)
	}
	return nil
}

// MarshalText is the inverse of UnmarshalText.
func (p SyncPolicy) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// resolve fills in the defaults and checks cfg. It runs before Start
// makes a temporary store, so StoreDir tells a given store from none.
func (cfg *Config) resolve() error {
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.User == "" && cfg.Password != "" {
		return invalid("a Password needs a User")
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = DefaultReadyTimeout
	}
	switch cfg.Sync {
	case SyncDefault:
		if cfg.SyncEvery != 0 {
			return invalid("a sync interval (SyncEvery) needs the interval sync policy")
		}
		cfg.Sync = SyncInterval
		if cfg.StoreDir != "" {
			cfg.Sync = SyncAlways
		}
	case SyncAlways:
		if cfg.SyncEvery != 0 {
			return invalid("a sync interval (SyncEvery) needs the interval sync policy, not always")
		}
	case SyncInterval:
	default:
		return invalid("unknown sync policy " + cfg.Sync.String())
	}
	if cfg.Sync == SyncInterval {
		if cfg.SyncEvery < 0 {
			return invalid(fmt.Sprintf("sync interval %v is negative", cfg.SyncEvery))
		}
		if cfg.SyncEvery == 0 {
			cfg.SyncEvery = DefaultSyncEvery
		}
	}
	if cfg.ClusterListen == "" {
		if len(cfg.Routes) > 0 {
			return invalid("cluster routes need a cluster listen address")
		}
		if cfg.ClusterName != "" {
			return invalid("a cluster name needs a cluster listen address")
		}
		return nil
	}
	if cfg.ServerName == "" {
		return invalid("a cluster node needs a server name, unique in its cluster")
	}
	if cfg.StoreDir == "" {
		// A node that rejoins with an empty store can roll the cluster back.
		return invalid("a cluster node needs its own store directory, kept across restarts")
	}
	if len(cfg.Routes) == 0 {
		// nats-server refuses to start JetStream clustering without them.
		return invalid("a cluster node needs routes to the other nodes")
	}
	if cfg.ClusterName == "" {
		cfg.ClusterName = DefaultClusterName
	}
	for _, r := range cfg.Routes {
		if _, err := routeURL(r); err != nil {
			return err
		}
	}
	return nil
}

// options returns the server options of a resolved cfg.
func (cfg *Config) options() (*server.Options, error) {
	host, port, err := hostPort("listen", cfg.Listen)
	if err != nil {
		return nil, err
	}
	opts := &server.Options{
		ServerName:   cfg.ServerName,
		Host:         host,
		Port:         port,
		JetStream:    true,
		StoreDir:     cfg.StoreDir,
		SyncAlways:   cfg.Sync == SyncAlways,
		SyncInterval: cfg.SyncEvery, // 0 under SyncAlways: nats-server's default then
		NoSigs:       true,
		NoLog:        true,
		Username:     cfg.User,
		Password:     cfg.Password,
	}
	if cfg.TLS != nil {
		opts.TLSConfig = cfg.TLS.Clone()
		opts.TLS = true
		opts.TLSVerify = cfg.TLS.ClientAuth == tls.RequireAndVerifyClientCert
		opts.TLSTimeout = 5 // seconds to complete the handshake
	}
	if cfg.ClusterListen != "" {
		host, port, err := hostPort("cluster listen", cfg.ClusterListen)
		if err != nil {
			return nil, err
		}
		opts.Cluster = server.ClusterOpts{Name: cfg.ClusterName, Host: host, Port: port}
		for _, r := range cfg.Routes {
			u, _ := routeURL(r) // resolve checked it
			opts.Routes = append(opts.Routes, u)
		}
	}
	return opts, nil
}

// hostPort splits a host:port listen address; port 0 becomes
// server.RANDOM_PORT.
func hostPort(what, addr string) (string, int, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, invalid(fmt.Sprintf("%s address %q: %v", what, addr, err))
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, invalid(fmt.Sprintf("%s port %q is not a port number", what, portStr))
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	return host, port, nil
}

// routeURL parses a route, nats-route://host:port.
func routeURL(r string) (*url.URL, error) {
	u, err := url.Parse(r)
	if err == nil && u.Scheme == "nats-route" && u.Hostname() != "" && (u.Path == "" || u.Path == "/") {
		if port, err := strconv.Atoi(u.Port()); err == nil && port > 0 && port <= 65535 {
			return u, nil
		}
	}
	return nil, invalid(fmt.Sprintf("route %q: want nats-route://host:port", r))
}

func invalid(msg string) error { return fmt.Errorf("%w: %s", ErrInvalidConfig, msg) }

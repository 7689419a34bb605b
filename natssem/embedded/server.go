package embedded

import (
	"context"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Server is a running embedded NATS server.
type Server struct {
	ns      *server.Server
	tempDir string
}

// Start starts a server and waits until it accepts connections. A cluster
// node's JetStream may not answer yet: see WaitJetStream. Errors for a
// Config that cannot work wrap ErrInvalidConfig.
func Start(cfg Config) (*Server, error) {
	if err := cfg.resolve(); err != nil {
		return nil, err
	}
	opts, err := cfg.options()
	if err != nil {
		return nil, err
	}
	s := &Server{}
	if opts.StoreDir == "" {
		if s.tempDir, err = os.MkdirTemp("", "tokensem-nats-*"); err != nil {
			return nil, fmt.Errorf("embedded: %w", err)
		}
		opts.StoreDir = s.tempDir
	}
	if cfg.Options != nil {
		if err := cfg.Options(opts); err != nil {
			s.cleanup()
			return nil, fmt.Errorf("embedded: options: %w", err)
		}
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		s.cleanup()
		// NewServer only validates the options and sets up from them.
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	s.ns = ns
	log := &startLog{fatal: make(chan string, 1)}
	ns.SetLoggerV2(log, false, false, false)
	go ns.Start()
	deadline := time.Now().Add(cfg.ReadyTimeout)
	for !ns.ReadyForConnections(20 * time.Millisecond) {
		var err error
		select {
		case msg := <-log.fatal:
			err = fmt.Errorf("embedded: the server could not start: %s", msg)
		default:
			if time.Now().After(deadline) {
				err = fmt.Errorf("embedded: the server did not accept connections within %v", cfg.ReadyTimeout)
			}
		}
		if err != nil {
			ns.Shutdown()
			ns.WaitForShutdown()
			s.cleanup()
			return nil, err
		}
	}
	return s, nil
}

// startLog is the server's logger (the embedded server logs nothing
// else): it keeps the first fatal error, such as a port in use or a store
// that cannot be made, which the server reports only by never becoming
// ready.
type startLog struct{ fatal chan string }

func (l *startLog) Fatalf(format string, v ...any) {
	select {
	case l.fatal <- fmt.Sprintf(format, v...):
	default:
	}
}

func (*startLog) Noticef(string, ...any) {}
func (*startLog) Warnf(string, ...any)   {}
func (*startLog) Errorf(string, ...any)  {}
func (*startLog) Debugf(string, ...any)  {}
func (*startLog) Tracef(string, ...any)  {}

// WaitJetStream waits until JetStream answers on this server: at once on a
// standalone server; on a cluster node, once a meta leader is elected (a
// majority of the nodes must be up and routed to each other) and this node
// has caught up with it. It returns the meta leader's server name, or
// ctx's error. For a moment after, the leader can still refuse to place a
// replicated stream ("no suitable peers for placement, peer offline")
// until every node has sent it its statistics.
func (s *Server) WaitJetStream(ctx context.Context) (leader string, err error) {
	for {
		if s.ns.JetStreamIsCurrent() {
			if leader = s.MetaLeader(); leader != "" {
				return leader, nil
			}
		}
		select {
		case <-ctx.Done():
			return "", context.Cause(ctx)
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// MetaLeader returns the server name of the JetStream meta leader: this
// server's own name when it is standalone, "" while a cluster has none.
func (s *Server) MetaLeader() string {
	if !s.ns.JetStreamIsClustered() {
		return s.ns.Name()
	}
	info, err := s.ns.Jsz(nil)
	if err != nil || info.Meta == nil {
		return ""
	}
	return info.Meta.Leader
}

// URL returns the client URL, nats://host:port, or tls://host:port when
// the server requires TLS. It never carries credentials.
func (s *Server) URL() string { return s.ns.ClientURL() }

// Addr returns the address clients connect to.
func (s *Server) Addr() net.Addr { return s.ns.Addr() }

// Name returns the server name.
func (s *Server) Name() string { return s.ns.Name() }

// ClusterURL returns nats-route://host:port, where the server accepts
// routes from other cluster nodes, or "" when it is not a cluster node.
func (s *Server) ClusterURL() string {
	a := s.ns.ClusterAddr()
	if a == nil {
		return ""
	}
	return "nats-route://" + a.String()
}

// Sync returns the sync policy the server runs with (SyncAlways or
// SyncInterval, as Options may have left it) and, under SyncInterval, its
// period.
func (s *Server) Sync() (SyncPolicy, time.Duration) {
	jc := s.ns.JetStreamConfig()
	if jc.SyncAlways {
		return SyncAlways, 0
	}
	return SyncInterval, jc.SyncInterval
}

// StoreDir returns the JetStream store directory.
func (s *Server) StoreDir() string { return s.ns.JetStreamConfig().StoreDir }

// NATS returns the underlying server, for tests that need more control.
func (s *Server) NATS() *server.Server { return s.ns }

// Shutdown stops the server, waits for it, and removes a temporary store.
func (s *Server) Shutdown() {
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
	s.cleanup()
}

func (s *Server) cleanup() {
	if s.tempDir != "" {
		_ = os.RemoveAll(s.tempDir)
	}
}

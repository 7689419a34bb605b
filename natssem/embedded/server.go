package embedded

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Config configures an embedded server. The zero Config is a server on a
// random loopback port with its store in a new temporary directory that
// Shutdown removes.
type Config struct {
	// Listen is host:port; port 0 picks a free one. Default "127.0.0.1:0".
	Listen string
	// StoreDir holds the JetStream store. Empty: a temporary directory,
	// removed by Shutdown.
	StoreDir string
	// ServerName names the server (default: a generated one).
	ServerName string
	// User and Password, when User is set, are the only credentials the
	// server accepts. Default: no authentication.
	User, Password string
	// TLS, when set, makes the server require TLS with this configuration
	// (URL then returns tls://host:port). A ClientAuth of
	// tls.RequireAndVerifyClientCert also makes it require client
	// certificates. Default: plaintext.
	TLS *tls.Config
	// Options, if set, is called with the server options before start
	// (after User, Password and TLS are applied), to add other
	// authentication, TLS settings or clustering.
	Options func(*server.Options) error
	// ReadyTimeout bounds the wait for the server to accept connections.
	// Default 10s.
	ReadyTimeout time.Duration
}

// Server is a running embedded NATS server.
type Server struct {
	ns      *server.Server
	tempDir string
}

// Start starts a server and waits until it accepts connections.
func Start(cfg Config) (*Server, error) {
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.User == "" && cfg.Password != "" {
		return nil, errors.New("embedded: a Password needs a User")
	}
	host, portStr, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("embedded: listen address %q: %w", cfg.Listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return nil, fmt.Errorf("embedded: listen port %q is not a port number", portStr)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	s := &Server{}
	if cfg.StoreDir == "" {
		if s.tempDir, err = os.MkdirTemp("", "tokensem-nats-*"); err != nil {
			return nil, fmt.Errorf("embedded: %w", err)
		}
		cfg.StoreDir = s.tempDir
	}
	opts := &server.Options{
		ServerName: cfg.ServerName,
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   cfg.StoreDir,
		NoSigs:     true,
		NoLog:      true,
		Username:   cfg.User,
		Password:   cfg.Password,
	}
	if cfg.TLS != nil {
		opts.TLSConfig = cfg.TLS.Clone()
		opts.TLS = true
		opts.TLSVerify = cfg.TLS.ClientAuth == tls.RequireAndVerifyClientCert
		opts.TLSTimeout = 5 // seconds to complete the handshake
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
		return nil, fmt.Errorf("embedded: %w", err)
	}
	s.ns = ns
	go ns.Start()
	wait := cfg.ReadyTimeout
	if wait <= 0 {
		wait = 10 * time.Second
	}
	if !ns.ReadyForConnections(wait) {
		ns.Shutdown()
		ns.WaitForShutdown()
		s.cleanup()
		return nil, errors.New("embedded: server not ready (is the port in use?)")
	}
	return s, nil
}

// URL returns the client URL, nats://host:port, or tls://host:port when
// the server requires TLS. It never carries credentials.
func (s *Server) URL() string { return s.ns.ClientURL() }

// Addr returns the address clients connect to.
func (s *Server) Addr() net.Addr { return s.ns.Addr() }

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

package amqpsem

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	neturl "net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/redact"
)

// DefaultHeartbeat is the AMQP heartbeat Dial asks for. RabbitMQ drops a
// silent client after about two heartbeats and requeues its tokens; the
// watchdog gives up on the connection before that (see Conn).
const DefaultHeartbeat = 5 * time.Second

// handshakeTimeout bounds connecting and the AMQP handshake.
const handshakeTimeout = 10 * time.Second

// DialOption configures Dial.
type DialOption func(*Conn) error

// DefaultMaxConnWaiters is how many callers may wait in Acquire at once on
// one Conn, across its semaphores: each waits on a channel of its own, and
// RabbitMQ's default channel_max is 2,047 per connection, holders' channels
// included.
const DefaultMaxConnWaiters = 1024

// WithMaxConnWaiters caps the callers waiting in Acquire at once on the
// Conn, across all its semaphores (default DefaultMaxConnWaiters,
// 1..65,535); one more fails at once with tokensem.ErrTooManyWaiters.
// TryAcquire never waits and is not counted. The broker cannot cap waiters
// across clients: bound what one user can take with RabbitMQ's user limits
// (max-connections, max-channels; see docs/permissions-rabbitmq.md).
func WithMaxConnWaiters(n int) DialOption {
	return func(c *Conn) error {
		if n < 1 || n > 65535 {
			return fmt.Errorf("%w: max waiters %d (want 1..65535)", tokensem.ErrInvalidOption, n)
		}
		c.maxWaiters = n
		return nil
	}
}

// WithHeartbeat sets the AMQP heartbeat (whole seconds, at least 1s; default
// DefaultHeartbeat). A frozen or partitioned holder loses its permit about
// two heartbeats after it went silent. The Conn's watchdog tells a holder
// whose connection stopped working within 1.5 heartbeats (W, see the
// docs/protocol-rabbitmq.md): Init stores that bound in the semaphore, and Open and Init
// refuse a Conn whose heartbeat is longer than the one the semaphore was
// made with (tokensem.ErrInvalidOption).
func WithHeartbeat(d time.Duration) DialOption {
	return func(c *Conn) error {
		if d < time.Second || d%time.Second != 0 {
			return fmt.Errorf("%w: heartbeat %v (want whole seconds, >= 1s)", tokensem.ErrInvalidOption, d)
		}
		c.heartbeat = d
		return nil
	}
}

// WithTLS sets the TLS configuration of an amqps:// connection (Dial rejects
// it for amqp://). Dial keeps a copy, with ServerName set to the URL's host
// when it is empty. Without WithTLS, an amqps:// URL follows amqp091's
// conventions: it verifies the broker against the system's roots, or the
// file named by the URL's cacertfile query parameter, presents the client
// certificate of certfile and keyfile if both are given, and expects the
// certificate to name server_name_indication, else the URL's host. WithTLS
// overrides those parameters. A nil config is an error.
//
// Dial's context and its handshake timeout bound the TLS handshake too. A
// failed handshake, a broker that refuses the client's certificate, and a
// broker that closes the connection right after the handshake (how some
// refuse a certificate) are errors wrapping ErrTLS.
func WithTLS(cfg *tls.Config) DialOption {
	return func(c *Conn) error {
		if cfg == nil {
			return fmt.Errorf("%w: nil TLS config", tokensem.ErrInvalidOption)
		}
		c.tls = cfg.Clone()
		return nil
	}
}

// WithDialLogger sets the connection's logger (default: discard).
func WithDialLogger(l *slog.Logger) DialOption {
	return func(c *Conn) error {
		if l == nil {
			return fmt.Errorf("%w: nil logger", tokensem.ErrInvalidOption)
		}
		c.log = l
		return nil
	}
}

// logTo is the options of the functions that take a Conn and no options
// (List, Delete, ForceDelete): they log to the connection's logger.
func (c *Conn) logTo() []Option { return []Option{WithLogger(c.log)} }

// address is one broker node Dial may connect to.
type address struct {
	url     string      // as given to Dial (never printed unredacted)
	dialURL string      // what amqp091 dials: url, or its amqp:// form for amqps:// (Conn does the TLS)
	tls     *tls.Config // amqps://: the client's configuration; nil for amqp://
}

// Dial connects to the broker at url: amqp:// or amqps:// (see WithTLS),
// or a comma-separated list of such URLs, one per node of a RabbitMQ
// cluster. The nodes are tried in the order given, and when the connection
// drops, reconnection tries the next node first: callers waiting in Acquire
// go on waiting through another node, while permits held on the lost
// connection are lost (their Done closes).
//
// The first connection is made before Dial returns. When no node can be
// connected to, the error wraps each node's failure: ErrUnreachable for a
// broker that could not be reached, ErrAuth for refused credentials, ErrTLS
// for a failed TLS handshake.
func Dial(ctx context.Context, url string, opts ...DialOption) (*Conn, error) {
	c := newConn(nil, nil, DefaultHeartbeat, slog.New(slog.DiscardHandler))
	for _, o := range opts {
		if err := o(c); err != nil {
			return nil, err
		}
	}
	for _, u := range strings.Split(url, ",") {
		a, err := c.parseAddress(strings.TrimSpace(u))
		if err != nil {
			return nil, err
		}
		c.addrs = append(c.addrs, a)
	}
	if err := c.start(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

func newConn(addrs []address, tls *tls.Config, heartbeat time.Duration, log *slog.Logger) *Conn {
	return &Conn{addrs: addrs, tls: tls, heartbeat: heartbeat, log: log, maxWaiters: DefaultMaxConnWaiters,
		locks: make(map[string]*sync.Mutex), changed: make(chan struct{}), done: make(chan struct{})}
}

// start makes c's first connection and starts its supervisor.
func (c *Conn) start(ctx context.Context) error {
	s, err := c.connect(ctx)
	if err != nil {
		return err
	}
	c.cur = s
	c.wg.Add(1)
	go c.supervise(s)
	return nil
}

// sibling dials a second connection to c's nodes with c's settings, for
// work that must not share c's connection (see repairOrphans). The caller
// closes it.
func (c *Conn) sibling(ctx context.Context) (*Conn, error) {
	o := newConn(c.addrs, c.tls, c.heartbeat, c.log)
	if err := o.start(ctx); err != nil {
		return nil, err
	}
	return o, nil
}

// parseAddress checks one broker URL and prepares its TLS.
func (c *Conn) parseAddress(url string) (address, error) {
	if !strings.HasPrefix(url, "amqp://") && !strings.HasPrefix(url, "amqps://") {
		return address{}, fmt.Errorf("%w: url %q is not amqp:// or amqps://", tokensem.ErrInvalidOption, redact.URL(url))
	}
	if c.tls != nil && !strings.HasPrefix(url, "amqps://") {
		return address{}, fmt.Errorf("%w: WithTLS needs an amqps:// url, not %q", tokensem.ErrInvalidOption, redact.URL(url))
	}
	uri, err := amqp.ParseURI(url)
	if err != nil {
		// The parser's message quotes the URL, password included.
		return address{}, fmt.Errorf("%w: url %q: %s", tokensem.ErrInvalidOption, redact.URL(url), redact.URL(err.Error()))
	}
	a := address{url: url, dialURL: url}
	if uri.Scheme == "amqps" {
		if err := c.prepareTLS(&a, uri); err != nil {
			return address{}, err
		}
	}
	return a, nil
}

// prepareTLS sets up an amqps:// address: the TLS configuration (WithTLS's,
// else one from the URL as amqp091 would make it), and the amqp:// URL of
// the same broker that amqp091 is given. Conn does the TLS handshake
// itself, so that it can tell a refused certificate from a network failure.
func (c *Conn) prepareTLS(a *address, uri amqp.URI) error {
	cfg := c.tls.Clone()
	if cfg == nil {
		cfg = &tls.Config{ServerName: uri.ServerName, MinVersion: tls.VersionTLS12}
		if uri.CACertFile != "" {
			pem, err := os.ReadFile(uri.CACertFile)
			if err != nil {
				return fmt.Errorf("%w: cacertfile: %w", tokensem.ErrInvalidOption, err)
			}
			cfg.RootCAs = x509.NewCertPool()
			if !cfg.RootCAs.AppendCertsFromPEM(pem) {
				return fmt.Errorf("%w: cacertfile %s: no PEM certificate", tokensem.ErrInvalidOption, uri.CACertFile)
			}
		}
		if uri.CertFile != "" && uri.KeyFile != "" {
			pair, err := tls.LoadX509KeyPair(uri.CertFile, uri.KeyFile)
			if err != nil {
				return fmt.Errorf("%w: certfile/keyfile: %w", tokensem.ErrInvalidOption, err)
			}
			cfg.Certificates = []tls.Certificate{pair}
		}
	}
	if cfg.ServerName == "" {
		cfg.ServerName = uri.Host
	}
	u, err := neturl.Parse(a.url)
	if err != nil { // amqp.ParseURI accepted it: cannot happen
		return fmt.Errorf("%w: url %q", tokensem.ErrInvalidOption, redact.URL(a.url))
	}
	u.Scheme, u.Host = "amqp", net.JoinHostPort(uri.Host, strconv.Itoa(uri.Port))
	a.dialURL, a.tls = u.String(), cfg
	return nil
}

// connect connects to the first node that answers, trying them all once
// starting with c.next, and sets c.next to the node after it. Only Dial and
// then the supervisor call it, one at a time.
func (c *Conn) connect(ctx context.Context) (*session, error) {
	var errs []error
	for range c.addrs {
		i := c.next
		c.next = (c.next + 1) % len(c.addrs)
		s, err := c.connectTo(ctx, c.addrs[i])
		if err == nil {
			return s, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, errors.Join(errs...)
}

func (c *Conn) connectTo(ctx context.Context, a address) (*session, error) {
	s := &session{lost: make(chan struct{})}
	dialer := net.Dialer{Timeout: 10 * time.Second}
	cfg := amqp.Config{
		Heartbeat:  c.heartbeat,
		Locale:     "en_US",
		Properties: amqp.Table{"connection_name": "tokensem"},
		Dial: func(network, addr string) (net.Conn, error) {
			conn, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			// Bound the TLS and AMQP handshake, as amqp091's own dialer
			// does (it clears the deadline once the connection is open): a
			// broker that accepts TCP but never answers must not hang Dial.
			deadline := time.Now().Add(handshakeTimeout)
			if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
				deadline = dl
			}
			if err := conn.SetDeadline(deadline); err != nil {
				_ = conn.Close()
				return nil, err
			}
			s.sock = conn
			if a.tls == nil {
				return conn, nil
			}
			tc := tls.Client(conn, a.tls)
			if err := tc.HandshakeContext(ctx); err != nil {
				_ = conn.Close()
				return nil, err
			}
			s.tls = &tlsConn{Conn: tc}
			return s.tls, nil
		},
	}
	conn, err := amqp.DialConfig(a.dialURL, cfg)
	if err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.AccessRefused || errors.Is(err, amqp.ErrCredentials) || errors.Is(err, amqp.ErrSASL) {
			return nil, fmt.Errorf("%w: %s: %w", ErrAuth, redact.URL(a.url), err)
		}
		if isTLSFailure(err) {
			return nil, fmt.Errorf("%w: %s: %w", ErrTLS, redact.URL(a.url), err)
		}
		if s.tls != nil {
			// amqp091 keeps only the text of a read error; the TLS layer's
			// own error says whether the broker refused the client.
			read, ioErr := s.tls.state()
			switch {
			case isTLSFailure(ioErr):
				return nil, fmt.Errorf("%w: %s: %w", ErrTLS, redact.URL(a.url), ioErr)
			case read == 0 && isClosed(ioErr):
				return nil, fmt.Errorf("%w: %s: the broker closed the connection right after the TLS handshake (does it refuse the client certificate?): %w",
					ErrTLS, redact.URL(a.url), ioErr)
			}
		}
		return nil, fmt.Errorf("%w: %s: %w", ErrUnreachable, redact.URL(a.url), err)
	}
	s.conn = conn
	if v, ok := conn.Properties["version"].(string); ok {
		s.version = v
	}
	// amqp091 delivers connection.blocked notices synchronously from its
	// reader and closes the channel when the connection ends.
	blocks := conn.NotifyBlocked(make(chan amqp.Blocking, 1))
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		for b := range blocks {
			if b.Active {
				reason := b.Reason
				s.blocked.Store(&reason)
				c.log.Warn("the broker blocks publishing on this connection", "reason", reason)
			} else {
				s.blocked.Store(nil)
				c.log.Info("the broker unblocked publishing")
			}
		}
	}()
	return s, nil
}

// tlsConn is the TLS connection handed to amqp091. It records how many
// bytes the broker sent after the handshake and the first I/O error: with
// TLS 1.3 the client's side of the handshake ends before the broker has
// checked the client's certificate, so a refusal arrives on the first read
// (an alert) or as the connection closing, during the AMQP handshake.
type tlsConn struct {
	*tls.Conn
	read  atomic.Int64
	mu    sync.Mutex
	ioErr error
}

func (t *tlsConn) Read(p []byte) (int, error) {
	n, err := t.Conn.Read(p)
	t.read.Add(int64(n))
	t.fail(err)
	return n, err
}

func (t *tlsConn) Write(p []byte) (int, error) {
	n, err := t.Conn.Write(p)
	t.fail(err)
	return n, err
}

func (t *tlsConn) fail(err error) {
	if err == nil {
		return
	}
	t.mu.Lock()
	if t.ioErr == nil {
		t.ioErr = err
	}
	t.mu.Unlock()
}

// state returns the bytes read so far and the first I/O error.
func (t *tlsConn) state() (read int64, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.read.Load(), t.ioErr
}

package amqpsem

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	neturl "net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem"
)

// ErrAuth wraps a connection refused for its credentials.
var ErrAuth = errors.New("amqpsem: credentials refused")

// ErrUnreachable wraps a broker that could not be reached.
var ErrUnreachable = errors.New("amqpsem: broker unreachable")

// ErrTLS wraps a connection whose TLS handshake failed: the broker's
// certificate is not trusted (unknown authority, expired, issued for another
// host), the broker refused the client's certificate (or wanted one; also
// assumed when it closes the connection right after the handshake, before
// saying anything), or the peer does not speak TLS (an amqps:// URL for a
// plaintext port). It is not ErrUnreachable: the broker answered, and
// retrying will not help until the configuration changes. A broker that does
// not answer the handshake in time is ErrUnreachable.
var ErrTLS = errors.New("amqpsem: TLS handshake failed")

// ErrBlocked wraps a publish that did not complete while the broker was
// blocking publishers on the connection (connection.blocked: a memory or
// disk alarm; the reason is in the error).
var ErrBlocked = errors.New("amqpsem: the broker blocks publishing")

// DefaultHeartbeat is the AMQP heartbeat Dial asks for. RabbitMQ drops a
// silent client after about two heartbeats and requeues its tokens; the
// watchdog gives up on the connection before that (see Conn).
const DefaultHeartbeat = 5 * time.Second

// handshakeTimeout bounds connecting and the AMQP handshake.
const handshakeTimeout = 10 * time.Second

// Conn is one shared connection to RabbitMQ for all the semaphores of a
// process. It reconnects with backoff when the connection drops; permits
// held on a dropped connection are reported lost at once (the broker
// requeues their tokens), while callers waiting in Acquire subscribe again
// on the new connection.
//
// A watchdog confirms the connection with a round trip every heartbeat/2.
// When no round trip has succeeded for 1.5 heartbeats since it was sent, it
// closes the socket: RabbitMQ waits at least two heartbeats of silence
// before it requeues a client's tokens (measured: 3s for a 1s heartbeat on
// 3.10.8), so the holders learn of the loss first even when only one
// direction of the link fails.
type Conn struct {
	url       string      // as given to Dial
	dialURL   string      // what amqp091 dials: url, or its amqp:// form for amqps:// (Conn does the TLS)
	tls       *tls.Config // amqps://: the client's configuration; nil for amqp://
	heartbeat time.Duration
	log       *slog.Logger

	mu      sync.Mutex
	locks   map[string]*sync.Mutex // per semaphore: the lock queue excludes other connections only
	cur     *session
	closed  bool
	changed chan struct{} // closed and replaced whenever cur changes
	done    chan struct{}
	wg      sync.WaitGroup
}

// session is one live AMQP connection.
type session struct {
	conn    *amqp.Connection
	sock    net.Conn               // the TCP connection
	tls     *tlsConn               // over sock for amqps://, else nil
	lost    chan struct{}          // closed when this connection is gone
	version string                 // server version, e.g. "3.10.8"
	blocked atomic.Pointer[string] // the broker's reason while it blocks publishing
}

// DialOption configures Dial.
type DialOption func(*Conn) error

// WithHeartbeat sets the AMQP heartbeat (whole seconds, at least 1s; default
// DefaultHeartbeat). A frozen or partitioned holder loses its permit about
// two heartbeats after it went silent.
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

// Dial connects to the broker at url (amqp:// or amqps://; see WithTLS).
// The first connection is made before Dial returns: an unreachable broker
// is an error wrapping ErrUnreachable, refused credentials one wrapping
// ErrAuth, a failed TLS handshake one wrapping ErrTLS.
func Dial(ctx context.Context, url string, opts ...DialOption) (*Conn, error) {
	c := &Conn{url: url, heartbeat: DefaultHeartbeat, log: slog.New(slog.DiscardHandler),
		locks: make(map[string]*sync.Mutex), changed: make(chan struct{}), done: make(chan struct{})}
	for _, o := range opts {
		if err := o(c); err != nil {
			return nil, err
		}
	}
	if !strings.HasPrefix(url, "amqp://") && !strings.HasPrefix(url, "amqps://") {
		return nil, fmt.Errorf("%w: url %q is not amqp:// or amqps://", tokensem.ErrInvalidOption, redact(url))
	}
	if c.tls != nil && !strings.HasPrefix(url, "amqps://") {
		return nil, fmt.Errorf("%w: WithTLS needs an amqps:// url, not %q", tokensem.ErrInvalidOption, redact(url))
	}
	uri, err := amqp.ParseURI(url)
	if err != nil {
		// The parser's message quotes the URL, password included.
		return nil, fmt.Errorf("%w: url %q: %s", tokensem.ErrInvalidOption, redact(url), redact(err.Error()))
	}
	c.dialURL = url
	if uri.Scheme == "amqps" {
		if err := c.prepareTLS(uri); err != nil {
			return nil, err
		}
	}
	s, err := c.connect(ctx)
	if err != nil {
		return nil, err
	}
	c.cur = s
	c.wg.Add(1)
	go c.supervise(s)
	return c, nil
}

// prepareTLS sets up an amqps:// URL: the TLS configuration (WithTLS's, else
// one from the URL as amqp091 would make it), and the amqp:// URL of the
// same broker that amqp091 is given. Conn does the TLS handshake itself, so
// that it can tell a refused certificate from a network failure.
func (c *Conn) prepareTLS(uri amqp.URI) error {
	if c.tls == nil {
		cfg := &tls.Config{ServerName: uri.ServerName, MinVersion: tls.VersionTLS12}
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
		c.tls = cfg
	}
	if c.tls.ServerName == "" {
		c.tls.ServerName = uri.Host
	}
	u, err := neturl.Parse(c.url)
	if err != nil { // amqp.ParseURI accepted it: cannot happen
		return fmt.Errorf("%w: url %q", tokensem.ErrInvalidOption, redact(c.url))
	}
	u.Scheme, u.Host = "amqp", net.JoinHostPort(uri.Host, strconv.Itoa(uri.Port))
	c.dialURL = u.String()
	return nil
}

func (c *Conn) connect(ctx context.Context) (*session, error) {
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
			if c.tls == nil {
				return conn, nil
			}
			tc := tls.Client(conn, c.tls)
			if err := tc.HandshakeContext(ctx); err != nil {
				_ = conn.Close()
				return nil, err
			}
			s.tls = &tlsConn{Conn: tc}
			return s.tls, nil
		},
	}
	conn, err := amqp.DialConfig(c.dialURL, cfg)
	if err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.AccessRefused || errors.Is(err, amqp.ErrCredentials) || errors.Is(err, amqp.ErrSASL) {
			return nil, fmt.Errorf("%w: %s: %w", ErrAuth, redact(c.url), err)
		}
		if isTLSFailure(err) {
			return nil, fmt.Errorf("%w: %s: %w", ErrTLS, redact(c.url), err)
		}
		if s.tls != nil {
			// amqp091 keeps only the text of a read error; the TLS layer's
			// own error says whether the broker refused the client.
			read, ioErr := s.tls.state()
			switch {
			case isTLSFailure(ioErr):
				return nil, fmt.Errorf("%w: %s: %w", ErrTLS, redact(c.url), ioErr)
			case read == 0 && isClosed(ioErr):
				return nil, fmt.Errorf("%w: %s: the broker closed the connection right after the TLS handshake (does it refuse the client certificate?): %w",
					ErrTLS, redact(c.url), ioErr)
			}
		}
		return nil, fmt.Errorf("%w: %s: %w", ErrUnreachable, redact(c.url), err)
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

// waitConfirms waits for publisher confirms. A wait cut short while the
// broker blocks publishing says so (ErrBlocked).
func (c *Conn) waitConfirms(ctx context.Context, pending []*amqp.DeferredConfirmation) error {
	for _, dc := range pending {
		ok, err := dc.WaitContext(ctx)
		if err != nil {
			if reason := c.blockedReason(); reason != "" {
				return fmt.Errorf("%w (%s): waiting for a publisher confirm: %w", ErrBlocked, reason, err)
			}
			return fmt.Errorf("amqpsem: waiting for a publisher confirm: %w", err)
		}
		if !ok {
			return errors.New("amqpsem: the broker refused (nacked) a publish")
		}
	}
	return nil
}

// blockedReason returns why the broker blocks publishing on the current
// connection, or "".
func (c *Conn) blockedReason() string {
	c.mu.Lock()
	s := c.cur
	c.mu.Unlock()
	if s == nil {
		return ""
	}
	if r := s.blocked.Load(); r != nil {
		return *r
	}
	return ""
}

// supervise watches one connection at a time and replaces it when it dies.
func (c *Conn) supervise(s *session) {
	defer c.wg.Done()
	for {
		c.watch(s)
		close(s.lost)
		_ = s.conn.Close()
		c.mu.Lock()
		closed := c.closed
		c.mu.Unlock()
		if closed {
			return
		}
		c.log.Warn("amqp connection lost; reconnecting")
		next := c.reconnect()
		if next == nil {
			return
		}
		c.mu.Lock()
		c.cur = next
		close(c.changed)
		c.changed = make(chan struct{})
		c.mu.Unlock()
		s = next
	}
}

// watch returns when s is closed, by the broker, the network, Close or the
// watchdog.
func (c *Conn) watch(s *session) {
	closed := s.conn.NotifyClose(make(chan *amqp.Error, 1))
	hb := s.conn.Config.Heartbeat
	if hb <= 0 {
		select {
		case <-closed:
		case <-c.done:
		}
		return
	}
	probe, err := s.conn.Channel()
	if err != nil {
		return
	}
	tick := time.NewTicker(hb / 2)
	defer tick.Stop()
	lastOK := time.Now()
	for {
		select {
		case <-closed:
			return
		case <-c.done:
			return
		case <-tick.C:
			sent := time.Now()
			ok := make(chan error, 1)
			go func() { ok <- probe.ExchangeDeclarePassive("amq.direct", "direct", true, false, false, false, nil) }()
			deadline := time.NewTimer(time.Until(lastOK.Add(hb + hb/2)))
			select {
			case err := <-ok:
				deadline.Stop()
				if err != nil {
					return
				}
				lastOK = sent
			case <-deadline.C:
				attrs := []any{"heartbeat", hb}
				if r := s.blocked.Load(); r != nil {
					// A blocked connection that published is not read by
					// the broker until the alarm clears.
					attrs = append(attrs, "blocked", *r)
				}
				c.log.Warn("amqp connection silent for 1.5 heartbeats; dropping it", attrs...)
				_ = s.sock.Close()
				<-ok
				return
			case <-closed:
				deadline.Stop()
				return
			}
		}
	}
}

func (c *Conn) reconnect() *session {
	backoff := 100 * time.Millisecond
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		s, err := c.connect(ctx)
		cancel()
		if err == nil {
			c.log.Info("amqp connection restored")
			c.mu.Lock()
			if c.closed {
				c.mu.Unlock()
				_ = s.conn.Close()
				return nil
			}
			c.mu.Unlock()
			return s
		}
		c.log.Warn("amqp reconnect failed", "err", err, "retry_in", backoff)
		select {
		case <-c.done:
			return nil
		case <-time.After(backoff + rand.N(backoff/2)):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// session returns the live connection, waiting (bounded by ctx) while a
// reconnection is under way.
func (c *Conn) session(ctx context.Context) (*session, error) {
	for {
		c.mu.Lock()
		s, closed, changed := c.cur, c.closed, c.changed
		c.mu.Unlock()
		if closed {
			return nil, tokensem.ErrClosed
		}
		select {
		case <-s.lost:
		default:
			return s, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, fmt.Errorf("amqpsem: waiting for the connection to come back: %w", ctx.Err())
		case <-c.done:
			return nil, tokensem.ErrClosed
		}
	}
}

// channel opens a channel on the live connection. A connection that has
// just died may still look current until its supervisor notices: opening a
// channel on it waits for the next connection instead of failing.
func (c *Conn) channel(ctx context.Context) (*amqp.Channel, *session, error) {
	for {
		s, err := c.session(ctx)
		if err != nil {
			return nil, nil, err
		}
		ch, err := s.conn.Channel()
		if err == nil {
			return ch, s, nil
		}
		if !s.conn.IsClosed() && !errors.Is(err, amqp.ErrClosed) {
			return nil, nil, fmt.Errorf("amqpsem: open channel: %w", err)
		}
		select {
		case <-s.lost:
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("amqpsem: waiting for the connection to come back: %w", ctx.Err())
		case <-c.done:
			return nil, nil, tokensem.ErrClosed
		}
	}
}

// confirmChannel opens a channel in publisher-confirm mode.
func (c *Conn) confirmChannel(ctx context.Context) (*amqp.Channel, error) {
	ch, _, err := c.channel(ctx)
	if err != nil {
		return nil, err
	}
	if err := rpc(ctx, ch, func() error { return ch.Confirm(false) }); err != nil {
		_ = ch.Close()
		return nil, err
	}
	return ch, nil
}

// localLock returns the in-process lock of semaphore name: the broker's
// exclusive lock queue keeps other connections out, not other callers on
// this one.
func (c *Conn) localLock(name string) *sync.Mutex {
	c.mu.Lock()
	defer c.mu.Unlock()
	m, ok := c.locks[name]
	if !ok {
		m = new(sync.Mutex)
		c.locks[name] = m
	}
	return m
}

// ServerVersion returns the broker's version as it announced it.
func (c *Conn) ServerVersion() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur.version
}

// Close closes the connection and stops reconnecting. Permits held on it
// are lost (the broker requeues their tokens). Idempotent.
func (c *Conn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	close(c.done)
	s := c.cur
	c.mu.Unlock()
	err := s.conn.Close()
	c.wg.Wait()
	if errors.Is(err, amqp.ErrClosed) {
		err = nil
	}
	return err
}

// isTLSFailure reports whether err is a TLS handshake that failed for its
// content (certificates, protocol), not for the network.
func isTLSFailure(err error) bool {
	var (
		verify   *tls.CertificateVerificationError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
		record   tls.RecordHeaderError
		alert    tls.AlertError
		op       *net.OpError
	)
	return errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &hostname) ||
		errors.As(err, &invalid) || errors.As(err, &record) || errors.As(err, &alert) ||
		// crypto/tls reports an alert from the peer this way.
		errors.As(err, &op) && op.Op == "remote error"
}

// isClosed reports whether err is the peer closing or resetting the
// connection.
func isClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
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

func redact(raw string) string {
	if i := strings.Index(raw, "@"); i >= 0 {
		if j := strings.Index(raw, "://"); j >= 0 && j < i {
			return raw[:j+3] + "***" + raw[i:]
		}
	}
	return raw
}

package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/amqpsem"
	"github.com/tokensem/tokensem/internal/redact"
	"github.com/tokensem/tokensem/natssem"
)

// backend is a broker connection that can create and open semaphores.
type backend interface {
	init(ctx context.Context, name string, permits int, o semOptions) (tokensem.Semaphore, error)
	open(ctx context.Context, name string, o semOptions) (tokensem.Semaphore, error)
	list(ctx context.Context) ([]tokensem.Info, error)
	delete(ctx context.Context, name string, force bool) error
	close()
}

// semOptions are the semaphore settings the CLI exposes.
type semOptions struct {
	lease    time.Duration // 0: default
	replicas int           // 0: default
	key      []byte
	timeout  time.Duration
	log      *slog.Logger // nil: the libraries' default (discard)
}

// connect dials the broker named by g.url, one URL or a comma-separated
// list of the nodes of one cluster; the scheme picks the backend.
func connect(ctx context.Context, g *globals) (backend, error) {
	us, err := parseURLs(g.url)
	if err != nil {
		return nil, err
	}
	if g.group != "" {
		if err := tokensem.ValidateName(g.group); err != nil {
			return nil, usageErr{fmt.Errorf("--group: %w", err)}
		}
	}
	switch strings.ToLower(us[0].Scheme) {
	case "nats", "tls":
		return connectNATS(ctx, g, us)
	default:
		return connectAMQP(ctx, g, us)
	}
}

// parseURLs parses --url: one broker URL, or a comma-separated list of
// URLs of one backend (the nodes of a cluster).
func parseURLs(raw string) ([]*url.URL, error) {
	var us []*url.URL
	family := ""
	for _, part := range strings.Split(raw, ",") {
		part = strings.TrimSpace(part)
		u, err := url.Parse(part)
		if err != nil || u.Host == "" {
			return nil, usageErr{fmt.Errorf("--url %q is not a broker URL (want nats://host:port, or a comma-separated list of them)", redact.URL(part))}
		}
		var f string
		switch strings.ToLower(u.Scheme) {
		case "nats", "tls":
			f = "nats"
		case "amqp", "amqps":
			f = "amqp"
		default:
			return nil, usageErr{fmt.Errorf("--url scheme %q: want nats://, amqp:// or amqps://", u.Scheme)}
		}
		if family != "" && f != family {
			return nil, usageErr{fmt.Errorf("--url mixes brokers (%s and %s): list the nodes of one cluster", redact.URL(us[0].String()), redact.URL(part))}
		}
		family = f
		us = append(us, u)
	}
	return us, nil
}

// joinURLs writes a list of URLs back as --url takes it.
func joinURLs(us []*url.URL) string {
	parts := make([]string, len(us))
	for i, u := range us {
		parts[i] = u.String()
	}
	return strings.Join(parts, ",")
}

type amqpBackend struct {
	c *amqpsem.Conn
}

func connectAMQP(ctx context.Context, g *globals, us []*url.URL) (backend, error) {
	cr, err := resolveCredentials(g, us[0])
	if err != nil {
		return nil, err
	}
	switch {
	case cr.tokenSource != "":
		return nil, usageErr{fmt.Errorf("%s applies to nats:// only: RabbitMQ takes a user and password", cr.tokenSource)}
	case cr.creds != "":
		return nil, usageErr{errors.New("--creds applies to nats:// only: RabbitMQ takes a user and password")}
	case g.group != "":
		return nil, usageErr{errors.New("--group applies to nats:// only: a RabbitMQ semaphore is a quorum queue of its own")}
	case g.inbox != "":
		return nil, usageErr{errors.New("--inbox-prefix applies to nats:// only")}
	}
	if cr.userpass {
		for _, u := range us {
			u.User = url.UserPassword(cr.user, cr.password)
		}
	}
	opts := []amqpsem.DialOption{amqpsem.WithDialLogger(g.logger())}
	tc, err := g.tlsConfig()
	if err != nil {
		return nil, err
	}
	if tc != nil {
		for _, u := range us {
			if !strings.EqualFold(u.Scheme, "amqps") {
				return nil, usageErr{fmt.Errorf("--tls-* flags need an amqps:// URL, not %s", redact.URL(u.String()))}
			}
		}
		opts = append(opts, amqpsem.WithTLS(tc))
	}
	dctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	c, err := amqpsem.Dial(dctx, joinURLs(us), opts...)
	switch {
	case errors.Is(err, amqpsem.ErrAuth):
		return nil, authErr{err}
	case errors.Is(err, amqpsem.ErrTLS):
		return nil, unavailableErr{withTLSHint(err)}
	case errors.Is(err, amqpsem.ErrUnreachable):
		return nil, unavailableErr{err}
	case err != nil:
		return nil, err
	}
	return amqpBackend{c: c}, nil
}

func (b amqpBackend) options(o semOptions) ([]amqpsem.Option, error) {
	if o.lease != 0 {
		return nil, usageErr{errors.New("--lease applies to nats:// only: on RabbitMQ a holder keeps its permit until its connection drops (--max-hold bounds a hold in exec)")}
	}
	if o.replicas != 0 {
		return nil, usageErr{errors.New("--replicas applies to nats:// only: quorum queues replicate across the RabbitMQ cluster")}
	}
	var opts []amqpsem.Option
	if o.key != nil {
		opts = append(opts, amqpsem.WithKey(o.key))
	}
	if o.log != nil {
		opts = append(opts, amqpsem.WithLogger(o.log))
	}
	if o.timeout != 0 {
		opts = append(opts, amqpsem.WithRequestTimeout(o.timeout))
	}
	return opts, nil
}

func (b amqpBackend) init(ctx context.Context, name string, permits int, o semOptions) (tokensem.Semaphore, error) {
	opts, err := b.options(o)
	if err != nil {
		return nil, err
	}
	s, err := amqpsem.Init(ctx, b.c, name, permits, opts...)
	return s, classify(err)
}

func (b amqpBackend) open(ctx context.Context, name string, o semOptions) (tokensem.Semaphore, error) {
	opts, err := b.options(o)
	if err != nil {
		return nil, err
	}
	s, err := amqpsem.Open(ctx, b.c, name, opts...)
	return s, classify(err)
}

func (b amqpBackend) list(ctx context.Context) ([]tokensem.Info, error) {
	infos, err := amqpsem.List(ctx, b.c)
	return infos, classify(err)
}

func (b amqpBackend) delete(ctx context.Context, name string, force bool) error {
	if force {
		return classify(amqpsem.ForceDelete(ctx, b.c, name))
	}
	return classify(amqpsem.Delete(ctx, b.c, name))
}

func (b amqpBackend) close() { _ = b.c.Close() }

type natsBackend struct {
	nc    *nats.Conn
	group string // --group
}

// inGroup returns the option that names the group, if any.
func (b natsBackend) inGroup() []natssem.Option {
	if b.group == "" {
		return nil
	}
	return []natssem.Option{natssem.WithGroup(b.group)}
}

func connectNATS(ctx context.Context, g *globals, us []*url.URL) (backend, error) {
	timeout := g.timeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(dl))
	}
	cr, err := resolveCredentials(g, us[0])
	if err != nil {
		return nil, err
	}
	opts := []nats.Option{nats.Name("seminit"), nats.Timeout(timeout), natsErrorHandler(ctx, g.logger()),
		nats.SetCustomDialer(greetingDialer{timeout: timeout})}
	if g.inbox != "" {
		inbox := nats.CustomInboxPrefix(g.inbox)
		if err := inbox(&nats.Options{}); err != nil { // nats.go's own check
			return nil, usageErr{fmt.Errorf("--inbox-prefix %q: want a subject without wildcards or a trailing '.': %w", g.inbox, err)}
		}
		opts = append(opts, inbox)
	}
	if cr.userpass || cr.tokenSource != "" || cr.creds != "" {
		// nats.go prefers the URL's userinfo to its options.
		for _, u := range us {
			u.User = nil
		}
	}
	raw := joinURLs(us)
	switch {
	case cr.userpass:
		opts = append(opts, nats.UserInfo(cr.user, cr.password))
	case cr.tokenSource != "":
		opts = append(opts, nats.Token(cr.token))
	case cr.creds != "":
		o, err := natsCreds(cr.creds)
		if err != nil {
			return nil, err
		}
		opts = append(opts, o)
	}
	tc, err := g.tlsConfig()
	if err != nil {
		return nil, err
	}
	if tc != nil {
		opts = append(opts, nats.Secure(tc))
	}
	nc, err := nats.Connect(raw, opts...)
	if err != nil {
		err = fmt.Errorf("%s: %w", redact.URL(g.url), err)
		switch {
		case isNATSAuth(err):
			return nil, authErr{err}
		case errors.Is(err, nats.ErrTLS):
			return nil, unavailableErr{withTLSHint(err)}
		case errors.Is(err, nats.ErrSecureConnWanted):
			return nil, unavailableErr{fmt.Errorf("%w (the --tls-* flags ask for TLS)", err)}
		}
		// A refused client certificate arrives after the client's side of
		// a TLS 1.3 handshake, not wrapped in nats.ErrTLS.
		return nil, unavailableErr{withTLSHint(err)}
	}
	return natsBackend{nc: nc, group: g.group}, nil
}

// natsCreds reads a NATS credentials file (a user JWT and the user's nkey
// seed, as `nsc generate creds` writes them). A file that is not one is a
// usage error.
func natsCreds(file string) (nats.Option, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, usageErr{fmt.Errorf("--creds: %w", err)}
	}
	if !bytes.Contains(b, []byte("-----BEGIN NATS USER JWT-----")) {
		return nil, usageErr{fmt.Errorf("--creds %s: not a NATS credentials file (no user JWT)", file)}
	}
	jwt, err := nkeys.ParseDecoratedJWT(b)
	if err != nil || strings.Count(jwt, ".") != 2 {
		return nil, usageErr{fmt.Errorf("--creds %s: malformed user JWT", file)}
	}
	kp, err := nkeys.ParseDecoratedUserNKey(b)
	if err != nil {
		return nil, usageErr{fmt.Errorf("--creds %s: no user nkey seed: %w", file, err)}
	}
	seed, err := kp.Seed()
	if err != nil {
		return nil, usageErr{fmt.Errorf("--creds %s: %w", file, err)}
	}
	return nats.UserJWTAndSeed(jwt, string(seed)), nil
}

// credentials are what a connection authenticates with: at most one of a
// user and password, a token and a creds file.
type credentials struct {
	userpass       bool
	user, password string
	token          string
	tokenSource    string // "--token" or "$TOKENSEM_TOKEN"; "" when no token
	creds          string // NATS credentials file
}

// resolveCredentials combines the credential flags (and their environment
// fallbacks) with the URL's userinfo: a flag wins over the URL. --password
// without --user keeps the URL's user; --user without a password sends an
// empty one. Two kinds at once are a usage error. With no flags at all the
// result is empty and the URL's userinfo, if any, is used as it is.
func resolveCredentials(g *globals, u *url.URL) (credentials, error) {
	var cr credentials
	pass, passSource := g.password()
	cr.token, cr.tokenSource = g.token()
	cr.creds = g.creds
	var kinds []string
	if g.user != "" || pass != "" {
		cr.userpass = true
		if g.user != "" {
			kinds = append(kinds, "--user")
		} else {
			kinds = append(kinds, passSource)
		}
	}
	if cr.tokenSource != "" {
		kinds = append(kinds, cr.tokenSource)
	}
	if cr.creds != "" {
		kinds = append(kinds, "--creds")
	}
	if len(kinds) > 1 {
		return credentials{}, usageErr{fmt.Errorf("%s: give one kind of credentials: --user/--password, --token or --creds", strings.Join(kinds, " and "))}
	}
	if !cr.userpass {
		return cr, nil
	}
	cr.user, cr.password = g.user, pass
	if cr.user == "" && u.User != nil {
		cr.user = u.User.Username()
	}
	if cr.user == "" {
		return credentials{}, usageErr{fmt.Errorf("%s needs a user name: --user NAME, or one in the URL", passSource)}
	}
	return cr, nil
}

// withTLSHint adds to a TLS failure what the user can do about it.
func withTLSHint(err error) error {
	var (
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
		record   tls.RecordHeaderError
		alert    tls.AlertError
	)
	var hint string
	switch {
	case errors.As(err, &unknown):
		hint = "the broker's certificate is not signed by a CA seminit trusts: give that CA with --tls-ca FILE"
	case errors.As(err, &hostname):
		hint = "the broker's certificate is not for the host in --url"
	case errors.As(err, &invalid):
		hint = "the broker's certificate is not valid (expired, or not a server certificate)"
	case errors.As(err, &record):
		hint = "the broker does not speak TLS on this port"
	case errors.As(err, &alert), strings.Contains(err.Error(), "remote error: tls: "),
		strings.Contains(err.Error(), "closed by remote after TLS handshake"):
		hint = "the broker refused this client's TLS: does it want a client certificate (--tls-cert, --tls-key) it trusts?"
	default:
		return err
	}
	return fmt.Errorf("%w; %s", err, hint)
}

func isNATSAuth(err error) bool {
	return errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) ||
		errors.Is(err, nats.ErrAuthRevoked) || errors.Is(err, nats.ErrAccountAuthExpired) ||
		strings.Contains(strings.ToLower(err.Error()), "authorization violation")
}

func (b natsBackend) options(o semOptions) []natssem.Option {
	opts := b.inGroup()
	if o.log != nil {
		opts = append(opts, natssem.WithLogger(o.log))
	}
	if o.lease != 0 {
		opts = append(opts, natssem.WithLease(o.lease))
	}
	if o.replicas != 0 {
		opts = append(opts, natssem.WithReplicas(o.replicas))
	}
	if o.key != nil {
		opts = append(opts, natssem.WithKey(o.key))
	}
	if o.timeout != 0 {
		opts = append(opts, natssem.WithRequestTimeout(o.timeout))
	}
	return opts
}

func (b natsBackend) init(ctx context.Context, name string, permits int, o semOptions) (tokensem.Semaphore, error) {
	s, err := natssem.Init(ctx, b.nc, name, permits, b.options(o)...)
	return s, classify(err)
}

func (b natsBackend) open(ctx context.Context, name string, o semOptions) (tokensem.Semaphore, error) {
	s, err := natssem.Open(ctx, b.nc, name, b.options(o)...)
	return s, classify(err)
}

func (b natsBackend) list(ctx context.Context) ([]tokensem.Info, error) {
	infos, err := natssem.List(ctx, b.nc, b.inGroup()...)
	return infos, classify(err)
}

func (b natsBackend) delete(ctx context.Context, name string, force bool) error {
	if force {
		return classify(natssem.ForceDelete(ctx, b.nc, name, b.inGroup()...))
	}
	return classify(natssem.Delete(ctx, b.nc, name, b.inGroup()...))
}

func (b natsBackend) close() { b.nc.Close() }

// classify marks broker-side unavailability (no JetStream, no answer, a
// connection that went away).
func classify(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, nats.ErrNoResponders), errors.Is(err, nats.ErrTimeout), errors.Is(err, amqp.ErrClosed),
		errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrConnectionClosed),
		errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		return unavailableErr{err}
	default:
		return err
	}
}

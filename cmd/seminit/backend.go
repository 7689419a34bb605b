package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/amqpsem"
	"github.com/tokensem/tokensem/natssem"
)

// backend is a broker connection that can create and open semaphores.
type backend interface {
	init(ctx context.Context, name string, permits int, o semOptions) (tokensem.Semaphore, error)
	open(ctx context.Context, name string, o semOptions) (tokensem.Semaphore, error)
	close()
}

// semOptions are the semaphore settings the CLI exposes.
type semOptions struct {
	lease    time.Duration // 0: default
	replicas int           // 0: default
	key      []byte
	timeout  time.Duration
}

// connect dials the broker named by g.url; its scheme picks the backend.
func connect(ctx context.Context, g *globals) (backend, error) {
	u, err := url.Parse(g.url)
	if err != nil || u.Host == "" {
		return nil, usageErr{fmt.Errorf("--url %q is not a broker URL (want nats://host:port)", g.url)}
	}
	switch strings.ToLower(u.Scheme) {
	case "nats", "tls":
		return connectNATS(ctx, g)
	case "amqp", "amqps":
		return connectAMQP(ctx, g)
	default:
		return nil, usageErr{fmt.Errorf("--url scheme %q: want nats://, amqp:// or amqps://", u.Scheme)}
	}
}

type amqpBackend struct {
	c *amqpsem.Conn
}

func connectAMQP(ctx context.Context, g *globals) (backend, error) {
	dctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	c, err := amqpsem.Dial(dctx, g.url)
	switch {
	case errors.Is(err, amqpsem.ErrAuth):
		return nil, authErr{err}
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

func (b amqpBackend) close() { _ = b.c.Close() }

type natsBackend struct {
	nc *nats.Conn
}

func connectNATS(ctx context.Context, g *globals) (backend, error) {
	timeout := g.timeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(dl))
	}
	nc, err := nats.Connect(g.url, nats.Name("seminit"), nats.Timeout(timeout))
	if err != nil {
		if isNATSAuth(err) {
			return nil, authErr{fmt.Errorf("%s: %w", redact(g.url), err)}
		}
		return nil, unavailableErr{fmt.Errorf("%s: %w", redact(g.url), err)}
	}
	return natsBackend{nc: nc}, nil
}

func isNATSAuth(err error) bool {
	return errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) ||
		errors.Is(err, nats.ErrAuthRevoked) || errors.Is(err, nats.ErrAccountAuthExpired) ||
		strings.Contains(strings.ToLower(err.Error()), "authorization violation")
}

func (b natsBackend) options(o semOptions) []natssem.Option {
	var opts []natssem.Option
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

func (b natsBackend) close() { b.nc.Close() }

// classify marks broker-side unavailability (no JetStream, no answer, a
// connection that went away).
func classify(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, nats.ErrNoResponders), errors.Is(err, nats.ErrTimeout), errors.Is(err, amqp.ErrClosed),
		errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrConnectionClosed),
		strings.Contains(err.Error(), "jetstream not enabled"):
		return unavailableErr{err}
	default:
		return err
	}
}

// redact hides a URL's password in messages.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(bad url)"
	}
	return u.Redacted()
}

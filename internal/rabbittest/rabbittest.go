package rabbittest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/modules/rabbitmq"
)

// Image is the container image used when no $RABBITMQ_URL is set.
const Image = "rabbitmq:4-management"

// ErrNoBroker is returned by Start when neither a URL nor Docker exists.
var ErrNoBroker = errors.New("rabbittest: no RabbitMQ: set RABBITMQ_URL or run a Docker engine")

// Broker is a RabbitMQ reachable by tests.
type Broker struct {
	URL  string // amqp://user:pass@host:port/
	Addr string // host:port, for fault proxies
	stop func()
}

// Stop stops a container started for the tests (no-op for $RABBITMQ_URL).
func (b *Broker) Stop() {
	if b.stop != nil {
		b.stop()
	}
}

// Start returns the broker tests should use.
func Start(ctx context.Context) (*Broker, error) {
	if raw := os.Getenv("RABBITMQ_URL"); raw != "" {
		return fromURL(raw, nil)
	}
	if err := dockerHealthy(ctx); err != nil {
		return nil, fmt.Errorf("%w (docker: %v)", ErrNoBroker, err)
	}
	c, err := rabbitmq.Run(ctx, Image)
	if err != nil {
		return nil, fmt.Errorf("rabbittest: start %s: %w", Image, err)
	}
	raw, err := c.AmqpURL(ctx)
	if err != nil {
		_ = testcontainers.TerminateContainer(c)
		return nil, err
	}
	return fromURL(raw, func() { _ = testcontainers.TerminateContainer(c) })
}

// dockerHealthy reports whether a Docker engine answers. testcontainers-go
// panics ("rootless Docker not found") on machines with no engine at all,
// so the probe recovers.
func dockerHealthy(ctx context.Context) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("no Docker engine: %v", r)
		}
	}()
	p, err := testcontainers.NewDockerProvider()
	if err != nil {
		return err
	}
	defer p.Close()
	hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return p.Health(hctx)
}

func fromURL(raw string, stop func()) (*Broker, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("rabbittest: RABBITMQ_URL %q is not an amqp URL", raw)
	}
	return &Broker{URL: raw, Addr: u.Host, stop: stop}, nil
}

// URLVia returns the broker URL with its host:port replaced by addr (a
// fault proxy in front of the broker).
func (b *Broker) URLVia(addr string) string {
	u, _ := url.Parse(b.URL)
	u.Host = addr
	return u.String()
}

// Main is the body of a TestMain for packages that need RabbitMQ. It exits
// 0 without running tests when no broker exists and CI is unset, and 1
// under CI=true.
func Main(run func(*Broker) int) int {
	b, err := Start(context.Background())
	if err != nil {
		if os.Getenv("CI") == "true" {
			fmt.Fprintln(os.Stderr, "FAIL: CI=true and no RabbitMQ:", err)
			return 1
		}
		fmt.Fprintln(os.Stderr, "SKIP: no RabbitMQ for these tests:", err)
		return 0
	}
	defer b.Stop()
	return run(b)
}

package rabbittest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
)

// ErrNoBroker is returned by Start when $RABBITMQ_URL is not set.
var ErrNoBroker = errors.New("rabbittest: no RabbitMQ: set RABBITMQ_URL (bash .ci/rabbitmq.sh starts Debian's rabbitmq-server and prints it; with Docker, cd tools/rabbitcontainer && go run . starts a container and prints it)")

// Broker is a RabbitMQ reachable by tests.
type Broker struct {
	URL  string // amqp://user:pass@host:port/
	Addr string // host:port, for fault proxies
}

// Stop is a no-op: the broker of $RABBITMQ_URL outlives the tests.
func (b *Broker) Stop() {}

// Start returns the broker tests should use: the one at $RABBITMQ_URL.
func Start(ctx context.Context) (*Broker, error) {
	raw := os.Getenv("RABBITMQ_URL")
	if raw == "" {
		return nil, ErrNoBroker
	}
	return fromURL(raw)
}

func fromURL(raw string) (*Broker, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("rabbittest: RABBITMQ_URL %q is not an amqp URL", raw)
	}
	return &Broker{URL: raw, Addr: u.Host}, nil
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

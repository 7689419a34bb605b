package rabbittest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"testing"
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

// Missing ends a test that needs the RabbitMQ that Start did not find
// (err says why): a skip, or a failure under CI=true, where a missing
// broker is a failure.
func Missing(t testing.TB, err error) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true and no RabbitMQ: %v", err)
	}
	announce(err)
	t.Skipf("no RabbitMQ: %v", err)
}

// announce tells whoever runs the tests, once per go command, that
// RabbitMQ tests are skipped and how to run them. go test shows a passing
// package's output only with -v, so the line goes to the terminal
// (/dev/tty) when there is one, and to stderr otherwise (where -v and
// failures show it). A marker file named after the go command's process
// keeps the other packages of the same run quiet.
func announce(err error) {
	marker := filepath.Join(os.TempDir(), fmt.Sprintf("tokensem-tests-norabbit-%d", os.Getppid()))
	f, ferr := os.OpenFile(marker, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if ferr != nil {
		return // announced by another package of this run
	}
	_ = f.Close()
	line := fmt.Sprintf("tokensem tests: every RabbitMQ test is skipped (%v)\n", err)
	if tty, err := os.OpenFile("/dev/tty", os.O_WRONLY, 0); err == nil {
		_, _ = tty.WriteString(line)
		_ = tty.Close()
		return
	}
	_, _ = os.Stderr.WriteString(line)
}

// Skipped is Missing for a whole package (a TestMain that runs nothing
// without RabbitMQ): it reports whether the package is to be skipped
// (false under CI=true, where the caller fails instead).
func Skipped(err error) bool {
	if os.Getenv("CI") == "true" {
		return false
	}
	announce(err)
	return true
}

// Need returns the RabbitMQ of $RABBITMQ_URL, or ends the test (Missing).
func Need(t testing.TB) *Broker {
	t.Helper()
	b, err := Start(t.Context())
	if err != nil {
		Missing(t, err)
	}
	return b
}

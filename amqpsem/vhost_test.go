package amqpsem_test

import (
	"net/url"
	"os"
	"os/exec"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem/amqpsem"
	"github.com/tokensem/tokensem/internal/ids"
	"github.com/tokensem/tokensem/internal/semtest"
)

// place is where a test's semaphores live: guest's URL for a vhost of the
// test broker. A List reads a whole vhost, and takes its registry's lock:
// in the default vhost, beside the package's other tests, it waits for
// their Lists and describes the semaphores they leave invalid on purpose
// (about 10 s each, see errMissingRecord). Tests that measure what a List
// sees work in a vhost of their own (ownPlace).
type place string

// defaultPlace is the broker's default vhost, which most tests share.
func defaultPlace() place { return place(broker.URL) }

// ownPlace runs t beside the package's other parallel tests in a vhost of
// its own (vhostPlace). Without rabbitmqctl t runs alone, in the default
// vhost.
func ownPlace(t *testing.T) place {
	t.Helper()
	if _, err := exec.LookPath("rabbitmqctl"); err == nil {
		t.Parallel()
	}
	return vhostPlace(t)
}

// vhostPlace makes a vhost of t's own, deleted with everything in it when
// t ends. Without rabbitmqctl (a broker on another host) it returns the
// default vhost; with CI=true that fails t instead.
func vhostPlace(t *testing.T) place {
	t.Helper()
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and no rabbitmqctl: %v", err)
		}
		t.Logf("no rabbitmqctl (%v): the test works in the default vhost", err)
		return defaultPlace()
	}
	_, u := makeVhost(t, "amqp-test-")
	return place(u)
}

// dial connects to p.
func (p place) dial(t testing.TB) *amqpsem.Conn { return dialURL(t, string(p)) }

// channel opens a plain AMQP channel on p, closed with its connection when
// t ends.
func (p place) channel(t testing.TB) *amqp.Channel {
	t.Helper()
	conn, err := amqp.Dial(string(p))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// init makes semaphore n on p, closed and deleted when t ends.
func (p place) init(t testing.TB, n string, permits int, opts ...amqpsem.Option) *amqpsem.Semaphore {
	t.Helper()
	c := p.dial(t)
	s, err := amqpsem.Init(t.Context(), c, n, permits, opts...)
	if err != nil {
		t.Fatal(err)
	}
	// Delete what the test made (a long-lived broker would fill up), after
	// the semaphore's Close.
	t.Cleanup(func() { _ = amqpsem.ForceDelete(semtest.CleanupContext(t, time.Minute), c, n) })
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// rabbitctl runs rabbitmqctl (as root, on the broker's host), failing the
// test if it fails.
func rabbitctl(t testing.TB, args ...string) {
	t.Helper()
	out, err := exec.Command("rabbitmqctl", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("rabbitmqctl %q: %v\n%s", args, err, out)
	}
}

// makeVhost makes a vhost named prefix and a random suffix, where guest
// may do anything, and returns guest's URL for it; a cleanup deletes the
// vhost and everything in it. The caller has checked for rabbitmqctl.
func makeVhost(t testing.TB, prefix string) (vhost, guestURL string) {
	t.Helper()
	vhost = prefix + ids.New()[:10]
	rabbitctl(t, "add_vhost", vhost)
	t.Cleanup(func() { rabbitctl(t, "delete_vhost", vhost) })
	rabbitctl(t, "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
	return vhost, vhostURL(t, vhost, "guest", "guest")
}

// vhostURL is the broker's URL for user in vhost.
func vhostURL(t testing.TB, vhost, user, pass string) string {
	t.Helper()
	u, err := url.Parse(broker.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(user, pass)
	u.Path = "/" + vhost
	return u.String()
}

// fillRegistry puts entries with the given bodies, stamped at, into p's
// registry, which a List sets up first: a publish to a queue that does not
// exist is confirmed and dropped. A publish the broker returns (the
// registry deleted meanwhile) fails t.
func (p place) fillRegistry(t *testing.T, at time.Time, bodies ...[]byte) {
	t.Helper()
	if _, err := amqpsem.List(semtest.Context(t, time.Minute), p.dial(t)); err != nil {
		t.Fatalf("set up the registry: %v", err)
	}
	ch := p.channel(t)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	returned := ch.NotifyReturn(make(chan amqp.Return, len(bodies)))
	confirms := make([]*amqp.DeferredConfirmation, len(bodies))
	for i, body := range bodies {
		dc, err := ch.PublishWithDeferredConfirmWithContext(t.Context(), "", "tokensem..registry", true, false,
			amqp.Publishing{DeliveryMode: amqp.Persistent, Timestamp: at, Body: body})
		if err != nil {
			t.Fatal(err)
		}
		confirms[i] = dc
	}
	for i, dc := range confirms {
		if ok, err := dc.WaitContext(t.Context()); !ok || err != nil {
			t.Fatalf("registry entry %d confirmed %v: %v", i, ok, err)
		}
	}
	// The broker returns an unroutable message before it confirms it.
	select {
	case r := <-returned:
		t.Fatalf("the broker returned a registry entry: %s", r.ReplyText)
	default:
	}
}

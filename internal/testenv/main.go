// Package testenv gives a test package the brokers its tests talk to: an
// embedded NATS server, the RabbitMQ of $RABBITMQ_URL (a missing one fails
// under CI=true), and a TestMain that stops them and checks for leaked
// goroutines. The conformance suite (internal/semtest) knows no broker;
// this package is where brokers come from.
package testenv

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tokensem/tokensem/amqpsem"
	"github.com/tokensem/tokensem/internal/rabbittest"
	"github.com/tokensem/tokensem/internal/semtest"
	"github.com/tokensem/tokensem/natssem/embedded"
)

// Want says which brokers a test package talks to.
type Want int

const (
	// NATS starts an embedded NATS server for the package.
	NATS Want = 1 << iota
	// Rabbit finds the RabbitMQ of $RABBITMQ_URL; tests that need it call
	// Brokers.RabbitFor, which skips them without one (fails under CI).
	Rabbit
	// OnlyRabbit is for packages that test nothing without RabbitMQ: Main
	// runs no test without one (and fails under CI=true).
	OnlyRabbit
)

// Brokers are what Main found for a test package.
type Brokers struct {
	NATS      *embedded.Server   // with NATS
	Rabbit    *rabbittest.Broker // with Rabbit or OnlyRabbit; nil when none is configured
	RabbitErr error              // why Rabbit is nil
}

// RabbitFor returns the package's RabbitMQ for a test that needs one, and
// skips the test without one (fails it under CI=true: a missing broker is
// a failure there, not a skip).
func (b Brokers) RabbitFor(t testing.TB) *rabbittest.Broker {
	t.Helper()
	if b.Rabbit == nil {
		rabbittest.Missing(t, b.RabbitErr)
	}
	return b.Rabbit
}

// Main is the body of the TestMain of a package whose tests talk to
// brokers: it finds or starts the brokers want names, hands them to setup
// (which keeps them in the package's variables), runs the tests, stops
// what it started and runs after (in order), and fails a passing run that
// leaked goroutines. Use it as
//
//	func TestMain(m *testing.M) {
//		os.Exit(testenv.Main(m, testenv.NATS, func(b testenv.Brokers) { srv = b.NATS }))
//	}
func Main(m *testing.M, want Want, setup func(Brokers), after ...func()) int {
	var b Brokers
	if want&(Rabbit|OnlyRabbit) != 0 {
		b.Rabbit, b.RabbitErr = rabbittest.Start(context.Background())
		if b.Rabbit == nil && want&OnlyRabbit != 0 {
			if !rabbittest.Skipped(b.RabbitErr) {
				fmt.Fprintln(os.Stderr, "FAIL: CI=true and no RabbitMQ:", b.RabbitErr)
				return 1
			}
			fmt.Fprintln(os.Stderr, "SKIP: no RabbitMQ for these tests:", b.RabbitErr)
			return 0
		}
	}
	if want&NATS != 0 {
		srv, err := embedded.Start(embedded.Config{})
		if err != nil {
			fmt.Fprintln(os.Stderr, "embedded nats:", err)
			return 1
		}
		b.NATS = srv
	}
	setup(b)
	WaitBound()
	code := m.Run()
	if b.Rabbit != nil {
		if left := Sweep(b.Rabbit.URL, semtest.RunID); len(left) > 0 {
			fmt.Fprintf(os.Stderr, "could not delete %d semaphores the tests made on RabbitMQ: %s\n", len(left), strings.Join(left, "; "))
		}
	}
	if b.NATS != nil {
		b.NATS.Shutdown()
	}
	for _, f := range after {
		f()
	}
	if code == 0 {
		if err := goleak.Find(ServerLeaks...); err != nil {
			fmt.Fprintln(os.Stderr, "leaked goroutines:", err)
			code = 1
		}
	}
	return code
}

// ServerLeaks are the goroutines nats-server (v2.15.2) leaves behind when
// it shuts down while it creates a stream, for goleak to ignore. It sets
// up the stream's file store before it registers the stream with its
// account (stream.go, addStreamWithAssignmentAndMode: "Register with our
// account last"), and Shutdown stops only the registered streams: the
// store's flush loop runs on, and so does the access-time ticker (ats)
// that the store holds a reference to. Streams being created when a test
// stops a server (a cluster's followers creating replicas, a client's
// Init cut short) made runs fail at exit; 8 clients creating streams while
// Shutdown ran left one in 28 of 30 tries. A server a test forgets to
// shut down still fails the check: its listeners and clients leak too.
var ServerLeaks = []goleak.Option{
	goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*fileStore).flushStreamStateLoop"),
	goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server/ats.Register.func1"),
}

// parallel is how many tests that call t.Parallel run at once in a
// package whose TestMain is Main, unless go test's -parallel says
// otherwise.
const parallel = 8

// WaitBound lets up to parallel tests that call t.Parallel run at once;
// Main calls it, and a TestMain of its own calls it before m.Run.
// go test's default is GOMAXPROCS, 2 on CI's machines, which fits tests
// that compute; these wait on brokers (amqpsem's tests keep a sixth of one
// core busy one after another), and a test whose measurement needs the
// machine to itself does not call t.Parallel.
func WaitBound() {
	if !flag.Parsed() {
		flag.Parse()
	}
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", strconv.Itoa(max(parallel, runtime.GOMAXPROCS(0))))
	}
}

// Sweep force-deletes the semaphores whose names contain mark (a run's id:
// semtest.RunID) on the RabbitMQ at url (one URL, or a cluster's
// comma-separated list), which outlives the run, and returns what it could
// not delete. An embedded NATS goes with its temporary store.
func Sweep(url, mark string) (left []string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := amqpsem.Dial(ctx, url)
	if err != nil {
		return []string{err.Error()}
	}
	defer c.Close()
	infos, err := amqpsem.List(ctx, c)
	if err != nil {
		return []string{err.Error()}
	}
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		busy = make(chan struct{}, 4)
	)
	for _, in := range infos {
		if !strings.Contains(in.Name, mark) {
			continue
		}
		wg.Go(func() {
			busy <- struct{}{}
			defer func() { <-busy }()
			if err := amqpsem.ForceDelete(ctx, c, in.Name); err != nil {
				mu.Lock()
				left = append(left, in.Name+": "+err.Error())
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return left
}

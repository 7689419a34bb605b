package semgroup_test

import (
	"context"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/amqpsem"
	"github.com/tokensem/tokensem/internal/semtest"
	"github.com/tokensem/tokensem/internal/testenv"
	"github.com/tokensem/tokensem/natssem"
	"github.com/tokensem/tokensem/natssem/embedded"
	"github.com/tokensem/tokensem/semgroup"
)

var (
	srv     *embedded.Server
	brokers testenv.Brokers
)

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, testenv.NATS|testenv.Rabbit, func(b testenv.Brokers) { srv, brokers = b.NATS, b }))
}

// backends are the brokers every group test runs on: the embedded NATS
// server, and RabbitMQ when one is reachable (required under CI=true).
var backends = []struct {
	name string
	init func(t *testing.T) semgroup.InitFunc
}{
	{"nats", natsInit},
	{"nats-group", natsGroupInit},
	{"amqp", amqpInit},
}

func natsInit(t *testing.T) semgroup.InitFunc {
	t.Helper()
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return func(ctx context.Context, name string, permits int) (tokensem.Semaphore, error) {
		return natssem.Init(ctx, nc, name, permits)
	}
}

// inGroup makes the NATS semaphores of the "-group" backends keys of one
// group (natssem.WithGroup), the layout meant for semgroup.
var inGroup = natssem.WithGroup("semgroup")

func natsGroupInit(t *testing.T) semgroup.InitFunc {
	t.Helper()
	nc := natsConn(t)
	return func(ctx context.Context, name string, permits int) (tokensem.Semaphore, error) {
		return natssem.Init(ctx, nc, name, permits, inGroup)
	}
}

func amqpInit(t *testing.T) semgroup.InitFunc {
	t.Helper()
	rabbit := brokers.RabbitFor(t)
	c, err := amqpsem.Dial(bounded(t), rabbit.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return func(ctx context.Context, name string, permits int) (tokensem.Semaphore, error) {
		return amqpsem.Init(ctx, c, name, permits)
	}
}

// forEachBackend runs test once per broker.
func forEachBackend(t *testing.T, test func(t *testing.T, init semgroup.InitFunc)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) { test(t, b.init(t)) })
	}
}

var prefixSeq atomic.Int64

// uniquePrefix returns a name prefix no other test (or run) uses.
func uniquePrefix() string {
	return "g" + semtest.RunID + strconv.FormatInt(prefixSeq.Add(1), 10) + "-"
}

// bounded returns a context that ends with the test or after 45 s.
func bounded(t *testing.T) context.Context { return semtest.Context(t, 45*time.Second) }

// tracker wraps an InitFunc to count opens and closes per semaphore name.
// The semaphores are real; only Close is observed on its way through.
type tracker struct {
	init semgroup.InitFunc

	mu     sync.Mutex
	inits  map[string]int
	closes map[string]int
}

func track(init semgroup.InitFunc) *tracker {
	return &tracker{init: init, inits: map[string]int{}, closes: map[string]int{}}
}

func (tr *tracker) Init(ctx context.Context, name string, permits int) (tokensem.Semaphore, error) {
	tr.mu.Lock()
	tr.inits[name]++
	tr.mu.Unlock()
	s, err := tr.init(ctx, name, permits)
	if err != nil {
		return nil, err
	}
	return &closeCounted{Semaphore: s, tr: tr, name: name}, nil
}

func (tr *tracker) counts(name string) (inits, closes int) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.inits[name], tr.closes[name]
}

func (tr *tracker) totalInits() int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	n := 0
	for _, c := range tr.inits {
		n += c
	}
	return n
}

type closeCounted struct {
	tokensem.Semaphore
	tr   *tracker
	name string
	once sync.Once
}

func (c *closeCounted) Close() error {
	c.once.Do(func() {
		c.tr.mu.Lock()
		c.tr.closes[c.name]++
		c.tr.mu.Unlock()
	})
	return c.Semaphore.Close()
}

// newGroup makes a group and closes it when the test ends.
func newGroup(t *testing.T, init semgroup.InitFunc, permits int, opts ...semgroup.Option) *semgroup.Group {
	t.Helper()
	g, err := semgroup.New(init, permits, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	return g
}

// waitFor polls cond until it holds, failing the test after 20 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

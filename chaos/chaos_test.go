package chaos

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/amqpsem"
	"github.com/tokensem/tokensem/driver"
	"github.com/tokensem/tokensem/internal/freeport"
	"github.com/tokensem/tokensem/internal/rabbittest"
	"github.com/tokensem/tokensem/internal/semtest"
	"github.com/tokensem/tokensem/internal/testenv"
	"github.com/tokensem/tokensem/natssem"
	"github.com/tokensem/tokensem/natssem/embedded"
	"github.com/tokensem/tokensem/reconciler"
)

func TestMain(m *testing.M) {
	if os.Getenv(WorkerEnv) != "" {
		os.Exit(RunWorker())
	}
	testenv.WaitBound()
	os.Exit(m.Run())
}

const natsLease = time.Second

// natsSkew is how far ahead of the stamping clock the NATS workers read the
// server's clock when they decide a takeover (see docs/protocol-nats.md:
// the holder's margin is lease/5). Half the margin: the other half is room
// for a loaded machine to schedule a holder's deadline late.
const natsSkew = natsLease / 10

// natsRules are the checking rules of a NATS run. Only a kill or a freeze
// may free a slot behind its holder's back: a holder that is cut off, its
// link held up, or its server restarted or lost, still runs its deadline
// timer, and must see its loss before anyone else takes its slot, even
// with the server clock read natsSkew ahead.
func natsRules() []runOption {
	return []runOption{excusing("kill", "freeze"), withEnv(skewEnv + "=" + natsSkew.String())}
}

// settle stops the workers, repairs the semaphore once and checks that
// exactly N valid tokens remain; it reports how many the repair issued
// (tokens that were lost) or removed.
func settle(t *testing.T, r *run, sem tokensem.Semaphore, inv driver.Inventory) {
	r.stopAll()
	start := time.Now()
	rep, err := reconciler.Run(semtest.Context(t, time.Minute), inv, true)
	if err != nil {
		t.Fatalf("reconcile after the run (%v): %v", time.Since(start).Round(time.Millisecond), err)
	}
	st, err := sem.Status(semtest.Context(t, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after the run: reconcile issued %d (tokens lost), removed %d; status tokens %d of %d, healthy %v",
		rep.Issued, rep.Removed, st.Tokens, st.Permits, st.Healthy)
	if st.Tokens != r.permitsNow() || !st.Healthy {
		t.Errorf("after the run and a reconcile: %+v", st)
	}
}

// TestChaosNATS: workers on one NATS server, each behind its own fault
// proxy; holders are killed, frozen past their lease, cut off and
// delayed, and the server is restarted on the same store.
func TestChaosNATS(t *testing.T) { chaosNATS(t, "") }

// TestChaosNATSGroup is TestChaosNATS on a key of a group
// (natssem.WithGroup) that has other keys beside it, sharing its stream
// and bucket.
func TestChaosNATSGroup(t *testing.T) { chaosNATS(t, "chaos") }

func chaosNATS(t *testing.T, group string) {
	p := chosenProfile(t)
	store := t.TempDir()
	srv, err := embedded.Start(embedded.Config{StoreDir: store})
	if err != nil {
		t.Fatal(err)
	}
	addr := srv.Addr().String()
	defer func() { srv.Shutdown() }()

	name, label := "chaos-nats", "nats"
	opts := []natssem.Option{natssem.WithLease(natsLease)}
	rules := natsRules()
	if group != "" {
		label = "nats-group"
		opts = append(opts, natssem.WithGroup(group))
		rules = append(rules, withEnv(groupEnv+"="+group))
	}
	admin := func(name string) (*natssem.Semaphore, func()) {
		nc, err := nats.Connect(srv.URL())
		if err != nil {
			t.Fatal(err)
		}
		s, err := natssem.Init(semtest.Context(t, time.Minute), nc, name, p.permits, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return s, func() { _ = s.Close(); nc.Close() }
	}
	_, done := admin(name)
	done()
	if group != "" {
		for i := range 3 { // neighbours in the group's stream and bucket
			_, done := admin(fmt.Sprintf("neighbour-%d", i))
			done()
		}
	}

	ps := proxies(t, p.workers, addr)
	r := newRun(t, p, label, "nats", name, func(pos int) string { return "nats://" + ps[pos].Addr() }, rules...)
	r.inject(map[string]func(){
		"kill":      r.kill,
		"freeze":    func() { r.freeze(natsLease + natsLease/2) },
		"cut":       func() { r.cut(ps) },
		"delay":     func() { r.delay(ps, natsLease/4) },
		"partition": func() { r.partition(ps, natsLease+natsLease/2) },
		"restart": func() {
			f := fault{worker: -1, kind: "restart", begin: now()}
			srv.Shutdown()
			time.Sleep(100 * time.Millisecond)
			if srv, err = embedded.Start(embedded.Config{Listen: addr, StoreDir: store}); err != nil {
				t.Fatalf("restart on the same store: %v", err)
			}
			f.end = now()
			r.record(f)
		},
	})
	sem, done := admin(name)
	defer done()
	settle(t, r, sem, sem.Inventory())
	// A killed holder's slot is back once its token is redelivered (a
	// lease after its last in-progress ack) and claimed; a waiter whose pull
	// a restart lost pulls again as soon as it reconnects. Measured under
	// two CPU hogs: at most lease + 0.2 s.
	r.verdict(natsLease + time.Second)
}

// TestChaosNATSCluster: a 3-node cluster in this process, stream and KV
// replicated 3 ways; one node at a time is shut down and brought back on
// its store while holders are also killed and frozen.
func TestChaosNATSCluster(t *testing.T) {
	p := chosenProfile(t)
	const nodes = 3
	client, cluster := freeport.Need(t, nodes), freeport.Need(t, nodes)
	var routes []string
	for _, a := range cluster {
		routes = append(routes, "nats-route://"+a)
	}
	stores := make([]string, nodes)
	cfg := func(i int) embedded.Config {
		return embedded.Config{Listen: client[i], StoreDir: stores[i], ServerName: fmt.Sprintf("n%d", i),
			ReadyTimeout: 30 * time.Second,
			Options: func(o *server.Options) error {
				host, port := splitPort(t, cluster[i])
				o.Cluster = server.ClusterOpts{Name: "tokensem-chaos", Host: host, Port: port}
				o.Routes = server.RoutesFromStr(strings.Join(routes, ","))
				return nil
			}}
	}
	srvs := make([]*embedded.Server, nodes)
	for i := range srvs {
		stores[i] = t.TempDir()
		s, err := embedded.Start(cfg(i))
		if err != nil {
			t.Fatal(err)
		}
		srvs[i] = s
	}
	defer func() {
		for _, s := range srvs {
			if s != nil {
				s.Shutdown()
			}
		}
	}()
	var urls []string
	for _, a := range client {
		urls = append(urls, "nats://"+a)
	}
	url := strings.Join(urls, ",")
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	waitJetStream(t, nc)

	name := "chaos-cluster"
	sem, err := natssem.Init(semtest.Context(t, time.Minute), nc, name, p.permits,
		natssem.WithLease(natsLease), natssem.WithReplicas(3))
	if err != nil {
		t.Fatal(err)
	}
	defer sem.Close()

	r := newRun(t, p, "nats-cluster", "nats", name, func(int) string { return url }, natsRules()...)
	r.inject(map[string]func(){
		"kill":   r.kill,
		"freeze": func() { r.freeze(natsLease + natsLease/2) },
		"node-loss": func() {
			i := rand.IntN(nodes)
			f := fault{worker: -1, kind: "node-loss", begin: now()}
			srvs[i].Shutdown()
			srvs[i] = nil
			time.Sleep(2 * time.Second)
			s, err := embedded.Start(cfg(i))
			if err != nil {
				t.Fatalf("restart node %d: %v", i, err)
			}
			srvs[i] = s
			waitJetStream(t, nc)
			f.end = now()
			r.record(f)
		},
	})
	settle(t, r, sem, sem.Inventory())
	r.verdict(natsLease + 4*time.Second)
}

// TestChaosAMQP: workers on RabbitMQ, each behind its own fault proxy;
// holders are killed, frozen past the heartbeat timeout, cut off and
// delayed. With TOKENSEM_CHAOS_RABBIT_RESTART=1 the local broker is also
// restarted (rabbitmqctl stop_app/start_app): only for a broker nothing
// else uses meanwhile, so not in `go test ./...`, where other packages
// share it.
func TestChaosAMQP(t *testing.T) {
	t.Parallel() // RabbitMQ's chaos runs side by side, after the NATS ones
	p := chosenProfile(t)
	b := rabbittest.Need(t)
	c, err := amqpsem.Dial(semtest.Context(t, time.Minute), b.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	name := "chaos-" + driver.NewToken("x", 0, 0).ID[:8]
	sem, err := amqpsem.Init(semtest.Context(t, time.Minute), c, name, p.permits)
	if err != nil {
		t.Fatal(err)
	}
	defer sem.Close()
	defer func() { _ = amqpsem.ForceDelete(semtest.Context(t, time.Minute), c, name) }()

	ps := proxies(t, p.workers, b.Addr)
	r := newRun(t, p, "amqp", "amqp", name, func(pos int) string { return b.URLVia(ps[pos].Addr()) })
	kinds := map[string]func(){
		"kill":   r.kill,
		"freeze": func() { r.freeze(4 * time.Second) }, // RabbitMQ drops a client ~3 heartbeats (1s) after it went silent
		"cut":    func() { r.cut(ps) },
		"delay":  func() { r.delay(ps, 300*time.Millisecond) },
	}
	if os.Getenv("TOKENSEM_CHAOS_RABBIT_RESTART") == "1" {
		kinds["restart"] = func() {
			f := fault{worker: -1, kind: "restart", begin: now()}
			for _, verb := range []string{"stop_app", "start_app"} {
				if out, err := exec.Command("rabbitmqctl", "-q", verb).CombinedOutput(); err != nil {
					t.Fatalf("rabbitmqctl %s: %v\n%s", verb, err, out)
				}
			}
			f.end = now()
			r.record(f)
		}
	}
	r.inject(kinds)
	settle(t, r, sem, sem.Inventory())
	r.verdict(5 * time.Second)
}

func splitPort(t *testing.T, addr string) (string, int) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if _, err := fmt.Sscan(port, &n); err != nil {
		t.Fatal(err)
	}
	return host, n
}

// waitJetStream waits until the cluster's JetStream answers.
func waitJetStream(t *testing.T, nc *nats.Conn) {
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := semtest.Context(t, time.Minute)
	for {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := js.AccountInfo(actx)
		cancel()
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("JetStream not ready: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// TestChaosAMQPCluster: workers on a 3-node RabbitMQ cluster of
// .ci/rabbitmq-cluster.sh, spread over its nodes (each lists its node first
// and fails over to the others); holders are killed and frozen, and the
// node leading the token queue is SIGKILLed and later restarted. The
// semaphore is made through tsa, which therefore also leads its
// configuration queue at first. A node's loss may free the slots of the
// holders connected to it as they learn it (both follow from the same
// broken connections), so it is charged to every hold; the checker verifies
// that no slot is ever held twice beyond what the faults allow, and one
// reconcile at the end must leave N usable tokens.
func TestChaosAMQPCluster(t *testing.T) {
	t.Parallel() // RabbitMQ's chaos runs side by side, after the NATS ones
	p := chosenProfile(t)
	c := rabbittest.NeedCluster(t)
	// The test's own connection and semaphore (its Status and the final
	// reconcile) log here, shown if the test fails.
	var log semtest.SyncBuffer
	logger := slog.New(slog.NewTextHandler(&log, nil))
	defer func() {
		if t.Failed() {
			t.Logf("the test's semaphore's log:\n%s", log.String())
		}
	}()
	conn, err := amqpsem.Dial(semtest.Context(t, time.Minute), c.URLsFrom("tsa"), amqpsem.WithDialLogger(logger))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	name := "chaos-cluster-" + driver.NewToken("x", 0, 0).ID[:8]
	sem, err := amqpsem.Init(semtest.Context(t, time.Minute), conn, name, p.permits, amqpsem.WithLogger(logger))
	if err != nil {
		t.Fatal(err)
	}
	defer sem.Close()
	// Quorum queues left behind slow every later restart of the nodes.
	defer func() { _ = amqpsem.ForceDelete(semtest.Context(t, time.Minute), conn, name) }()

	r := newRun(t, p, "amqp-cluster", "amqp", name, func(pos int) string {
		return c.URLsFrom(rabbittest.Nodes[pos%len(rabbittest.Nodes)])
	})
	r.inject(map[string]func(){
		"kill":   r.kill,
		"freeze": func() { r.freeze(4 * time.Second) },
		"node-loss": func() {
			leader, err := c.Leader(amqpsem.ResourcesOf(name).Queue)
			if err != nil {
				t.Fatalf("token queue leader: %v", err)
			}
			f := fault{worker: -1, kind: "node-loss", begin: now()}
			if err := c.Kill(leader); err != nil {
				t.Fatal(err)
			}
			time.Sleep(2 * time.Second)
			if err := c.Start(leader); err != nil {
				t.Fatalf("restart %s: %v", leader, err)
			}
			f.end = now()
			r.record(f)
		},
	})
	settle(t, r, sem, sem.Inventory())
	r.verdict(5 * time.Second)
}

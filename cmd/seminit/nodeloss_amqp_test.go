package main

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tokensem/tokensem/internal/rabbittest"
)

// amqpVia is the RabbitMQ cluster reached through node first, failing over
// to the others (as a client listing the cluster's nodes would).
func amqpVia(c *rabbittest.Cluster, node string) broker {
	b := brokers()[1]
	b.url = c.URLsFrom(node)
	return b
}

// amqpInitThroughA creates a semaphore of permits through tsa (so tsa
// leads its queues) and deletes it when the test ends: quorum queues left
// behind slow every later restart of the nodes.
func amqpInitThroughA(t *testing.T, c *rabbittest.Cluster, permits int) string {
	t.Helper()
	name := uniqueName(t)
	amqpVia(c, "tsa").mustInit(t, name, permits)
	t.Cleanup(func() { amqpVia(c, "tsb").seminit(t, "delete", "--name", name, "--force") })
	return name
}

// amqpNodeLoss runs issue 17's RabbitMQ scenario on the cluster of
// .ci/rabbitmq-cluster.sh: a semaphore of permits created through tsa (so
// tsa leads its configuration and token queues), perNode exec workers
// through each node, each holding hold; victim is SIGKILLed killAfter the
// workers' start and restarted downFor later.
func amqpNodeLoss(t *testing.T, victim string, permits, perNode int, hold, killAfter, downFor time.Duration) nodeLossResult {
	c := rabbittest.NeedCluster(t)
	name := amqpInitThroughA(t, c, permits)
	m := startMeter(t, permits)
	via := make([]broker, len(rabbittest.Nodes))
	for i, node := range rabbittest.Nodes {
		via[i] = amqpVia(c, node)
	}
	start := time.Now()
	workers := startExecWorkers(t, m, name, hold, perNode, via)
	time.Sleep(killAfter)
	res := amqpLoseNode(t, c, victim, downFor, start, m, workers)
	amqpAfterLoss(t, c, name, permits)
	return res
}

// amqpLoseNode SIGKILLs victim, restarts it downFor later, and waits for
// the workers started at start, reporting to m: what they saw.
func amqpLoseNode(t *testing.T, c *rabbittest.Cluster, victim string, downFor time.Duration, start time.Time, m *meter, workers []execWorker) nodeLossResult {
	t.Helper()
	killed := time.Now()
	if err := c.Kill(victim); err != nil {
		t.Fatal(err)
	}
	t.Logf("%v after the start: SIGKILLed %s", time.Since(start).Round(time.Millisecond), victim)
	time.Sleep(downFor)
	if err := c.Start(victim); err != nil {
		t.Fatal(err)
	}
	t.Logf("%v after the start: %s back", time.Since(start).Round(time.Millisecond), victim)

	res := nodeLossResult{codes: map[int][]int{}, meter: m, killed: killed}
	for i, n := range rabbittest.Nodes {
		if n == victim {
			res.victim = i
		}
	}
	res.collect(t, workers, func(i int) string { return rabbittest.Nodes[i] })
	res.elapsed = time.Since(start)
	return res
}

// amqpAfterLoss checks the semaphore after a node-loss run: a permit
// through each node alone, and once a reconcile has repaired what the loss
// left, exactly permits token messages, none unacknowledged.
func amqpAfterLoss(t *testing.T, c *rabbittest.Cluster, name string, permits int) {
	t.Helper()
	for _, node := range rabbittest.Nodes {
		only := brokers()[1]
		only.url = c.URL(node)
		if r := only.seminit(t, "exec", "--name", name, "--wait", "30s", "--", "true"); r.code != exitOK {
			t.Errorf("a permit through %s alone after the run: %v", node, r)
		}
	}
	viaB := amqpVia(c, "tsb")
	settleTokens(t, c, viaB, name, permits)
	if r := viaB.seminit(t, "status", "--name", name); r.code != exitOK ||
		!strings.Contains(r.stdout, fmt.Sprintf("tokens %d, available %d, held 0,", permits, permits)) {
		t.Errorf("status after the run: %v", r)
	}
}

// TestNodeLossAMQPLeader: 12 exec workers, 4 through each node of a 3-node
// RabbitMQ cluster (each listing its node first), on a semaphore of 3
// permits created through tsa, each holding 2 s; tsa - leader of the
// configuration and token queues, and home of claim queues - is SIGKILLed
// 3 s in and restarted 10 s later. Workers through tsb and tsc all finish
// (0); those through tsa lose a permit they held (70) or fail over and
// finish (0); nobody is told the semaphore is not initialized.
func TestNodeLossAMQPLeader(t *testing.T) {
	t.Parallel()
	amqpNodeLoss(t, "tsa", 3, 4, 2*time.Second, 3*time.Second, 10*time.Second).check(t, 3, true)
}

// TestNodeLossAMQPIdle kills tsc, which leads no queue of the semaphore
// (claim queues first declared through it die with it, and their holders
// claim again): workers through tsc may lose a permit they held, the
// others may not.
func TestNodeLossAMQPIdle(t *testing.T) {
	t.Parallel()
	res := amqpNodeLoss(t, "tsc", 3, 3, time.Second, 2*time.Second, 5*time.Second)
	res.check(t, 3, true)
	for node, codes := range res.codes {
		for _, code := range codes {
			if node != res.victim && code != exitOK {
				t.Errorf("a worker through %s (the killed node is %s) exited %d", rabbittest.Nodes[node], rabbittest.Nodes[res.victim], code)
			}
		}
	}
}

// TestNodeLossAMQPHolders: every permit is held through tsa, the leader of
// the semaphore's queues, when tsa is SIGKILLed, while 6 exec workers wait
// through tsb and tsc. RabbitMQ 3.10 often keeps some or all of the lost
// holders' tokens checked out to consumers that are gone (a CI run of
// TestNodeLossAMQPLeader saw all 3, and every waiter gave up after 120 s):
// the waiters' orphan check (amqpsem.WithOrphanRepair) must issue
// replacements, so that every waiter finishes (0), while the holders lose
// their permits (70).
func TestNodeLossAMQPHolders(t *testing.T) {
	t.Parallel()
	const permits = 3
	c := rabbittest.NeedCluster(t)
	name := amqpInitThroughA(t, c, permits)
	m := startMeter(t, permits)
	start := time.Now()
	workers := startExecWorkers(t, m, name, 5*time.Minute, permits, []broker{amqpVia(c, "tsa")})
	eventually(t, 60*time.Second, "every permit held through tsa", func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.inside == permits
	})
	waiters := startExecWorkers(t, m, name, time.Second, 3, []broker{amqpVia(c, "tsb"), amqpVia(c, "tsc")})
	for _, w := range waiters {
		w.node++ // tsb is node 1, tsc node 2
		workers = append(workers, w)
	}
	time.Sleep(2 * time.Second) // the waiters queue
	res := amqpLoseNode(t, c, "tsa", 10*time.Second, start, m, workers)
	res.check(t, permits, true)
	for node, codes := range res.codes {
		for _, code := range codes {
			want := exitOK
			if node == 0 {
				want = exitSoftware
			}
			if code != want {
				t.Errorf("a worker through %s exited %d, want %d", rabbittest.Nodes[node], code, want)
			}
		}
	}
	amqpAfterLoss(t, c, name, permits)
}

// settleTokens repairs the semaphore until the broker holds exactly
// permits token messages, none unacknowledged. RabbitMQ 3.10 can keep the
// token of a holder on a lost node checked out to a consumer that no longer
// exists, until the queue's leader restarts (rabbitmq-server's open issue):
// a repair issues a replacement meanwhile, and after the leader's restart
// the returned copy is a duplicate the next repair removes. list_queues
// reads metrics emitted every 5 s, so each round waits for fresh ones.
func settleTokens(t *testing.T, c *rabbittest.Cluster, via broker, name string, permits int) {
	t.Helper()
	for round := 1; ; round++ {
		if r := via.seminit(t, "reconcile", "--name", name, "--repair"); r.code != exitOK {
			t.Errorf("reconcile --repair (round %d): %v", round, r)
		}
		time.Sleep(6 * time.Second)
		msgs, unacked := tokenQueueCounts(t, c, name)
		if msgs == permits && unacked == 0 {
			return
		}
		if round == 3 {
			t.Errorf("token queue after %d repairs: %d messages, %d unacknowledged; want %d and 0", round, msgs, unacked, permits)
			return
		}
		if unacked == 0 {
			continue
		}
		leader, err := c.Leader("tokensem." + name)
		if err != nil {
			t.Fatal(err)
		}
		r := via.seminit(t, "status", "--name", name)
		t.Logf("round %d: the token queue holds %d messages, %d unacknowledged for consumers that are gone; status says: %s; restarting the queue's leader %s",
			round, msgs, unacked, r.stdout, leader)
		if err := c.Stop(leader); err != nil {
			t.Fatal(err)
		}
		if err := c.Start(leader); err != nil {
			t.Fatal(err)
		}
	}
}

// tokenQueueCounts returns the broker's counts of a semaphore's token
// queue: messages and unacknowledged messages.
func tokenQueueCounts(t *testing.T, c *rabbittest.Cluster, name string) (msgs, unacked int) {
	t.Helper()
	out, err := c.Ctl("tsb", "-q", "list_queues", "name", "messages", "messages_unacknowledged")
	if err != nil {
		t.Fatalf("list_queues: %v", err)
	}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "tokensem."+name {
			msgs, _ = strconv.Atoi(f[1])
			unacked, _ = strconv.Atoi(f[2])
		}
	}
	return msgs, unacked
}

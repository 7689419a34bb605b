// Experiments on nats-server's "prioritized" consumer priority policy, as a
// natssem token consumer would use it (docs/notes/priority-brokers.md).
// Run one question at a time:
//
//	go run . -q 1                  # serving order on one server: nak, AckWait expiry, ack + publish
//	go run . -q 2                  # pulls without a group or priority, non-JSON, no_wait
//	go run . -q 3 -fail stepdown   # R3: order, then a consumer leader stepdown
//	go run . -q 3 -fail stop       # R3: the leader's server shut down (consumer Replicas inherited)
//	go run . -q 3 -fail stop -crep 3
//	go run . -q 4                  # creating and updating a prioritized consumer
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem/internal/natstest"
	"github.com/tokensem/tokensem/natssem/embedded"
)

const group = "g"

var t0 = time.Now()

func logf(format string, a ...any) {
	fmt.Printf("[%6.3fs] %s\n", time.Since(t0).Seconds(), fmt.Sprintf(format, a...))
}

func must(err error) {
	if err != nil {
		fmt.Println("FATAL:", err)
		os.Exit(1)
	}
}

// body builds a pull request body. prio < 0 leaves "priority" out.
func body(prio int, grp string, noWait bool, expires, hb time.Duration) []byte {
	m := map[string]any{"batch": 1}
	if expires > 0 {
		m["expires"] = expires.Nanoseconds()
	}
	if hb > 0 {
		m["idle_heartbeat"] = hb.Nanoseconds()
	}
	if noWait {
		m["no_wait"] = true
	}
	if grp != "" {
		m["group"] = grp
	}
	if prio >= 0 {
		m["priority"] = prio
	}
	b, _ := json.Marshal(m)
	return b
}

type ev struct {
	w *waiter
	m *nats.Msg
	t time.Time
}

type waiter struct {
	name   string
	class  int
	node   int // index of the connection it uses
	nc     *nats.Conn
	inbox  string
	body   []byte
	sent   time.Time
	mu     sync.Mutex
	hbs    int
	lastHB time.Time
	got    []string // statuses and deliveries, with times
}

type rig struct {
	conns   []*nats.Conn
	js      jetstream.JetStream
	stream  string
	cons    string
	subj    string
	pullSub string
	evs     chan ev
	waiters []*waiter
}

func newRig(conns []*nats.Conn, stream string) *rig {
	js, err := jetstream.New(conns[0])
	must(err)
	return &rig{conns: conns, js: js, stream: stream, cons: "holders", subj: "tok." + stream,
		pullSub: "$JS.API.CONSUMER.MSG.NEXT." + stream + ".holders", evs: make(chan ev, 4096)}
}

func (r *rig) setup(replicas int, ackWait time.Duration, prio bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := r.js.CreateStream(ctx, jetstream.StreamConfig{Name: r.stream, Subjects: []string{r.subj},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage, Replicas: replicas})
	must(err)
	cc := jetstream.ConsumerConfig{Durable: r.cons, AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait,
		MaxDeliver: -1, MaxWaiting: 512, MaxAckPending: -1, DeliverPolicy: jetstream.DeliverAllPolicy}
	cc.Replicas = *consReplicas
	if prio {
		cc.PriorityPolicy = jetstream.PriorityPolicyPrioritized
		cc.PriorityGroups = []string{group}
	}
	_, err = r.js.CreateConsumer(ctx, r.stream, cc)
	must(err)
}

func (r *rig) publish() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := r.js.Publish(ctx, r.subj, []byte("token"))
	must(err)
}

func (r *rig) newWaiter(name string, class, node int, b []byte) *waiter {
	w := &waiter{name: name, class: class, node: node, nc: r.conns[node], inbox: r.conns[node].NewInbox(), body: b}
	_, err := w.nc.Subscribe(w.inbox, func(m *nats.Msg) {
		now := time.Now()
		code, desc := status(m)
		w.mu.Lock()
		if code == "100" {
			w.hbs++
			w.lastHB = now
			w.mu.Unlock()
			return
		}
		if code == "" {
			w.got = append(w.got, fmt.Sprintf("delivery@%.3fs", now.Sub(t0).Seconds()))
		} else {
			w.got = append(w.got, fmt.Sprintf("%s %s@%.3fs", code, desc, now.Sub(t0).Seconds()))
		}
		w.mu.Unlock()
		r.evs <- ev{w, m, now}
	})
	must(err)
	must(w.nc.Flush())
	r.waiters = append(r.waiters, w)
	return w
}

func (w *waiter) pull(subj string) {
	w.sent = time.Now()
	must(w.nc.PublishRequest(subj, w.inbox, w.body))
}

func status(m *nats.Msg) (string, string) {
	if len(m.Data) != 0 || m.Header == nil {
		return "", ""
	}
	return m.Header.Get("Status"), m.Header.Get("Description")
}

func isDelivery(m *nats.Msg) bool { return strings.HasPrefix(m.Reply, "$JS.ACK.") }

// next waits for the next event (not a heartbeat).
func (r *rig) next(d time.Duration) (ev, bool) {
	select {
	case e := <-r.evs:
		return e, true
	case <-time.After(d):
		return ev{}, false
	}
}

// hold makes a holder pull the token (which must be available) and returns it.
func (r *rig) hold(node int) (*waiter, *nats.Msg) {
	h := r.newWaiter("holder", 0, node, body(0, group, false, 30*time.Second, 5*time.Second))
	h.pull(r.pullSub)
	for {
		e, ok := r.next(5 * time.Second)
		if !ok {
			must(fmt.Errorf("holder got nothing"))
		}
		if e.w == h && isDelivery(e.m) {
			return h, e.m
		}
		logf("while holding: %s got %v", e.w.name, e.m.Header)
	}
}

// release hands the token back by mode.
func (r *rig) release(w *waiter, m *nats.Msg, mode string) {
	switch mode {
	case "nak":
		must(w.nc.Publish(m.Reply, []byte("-NAK")))
	case "expiry":
	case "ackpub":
		_, err := w.nc.Request(m.Reply, []byte("+ACK"), 5*time.Second)
		must(err)
		r.publish()
	}
}

// cycle releases the held token and records who gets each delivery, until
// want deliveries or a quiet timeout. hook(i) runs before releasing the i-th
// delivery's token (0 = the holder's).
func (r *rig) cycle(hw *waiter, hm *nats.Msg, mode string, want int, quiet time.Duration, hook func(i int)) ([]*waiter, *waiter, *nats.Msg) {
	var order []*waiter
	var lats []time.Duration
	cw, cm := hw, hm
	for i := 0; len(order) < want; i++ {
		if hook != nil {
			hook(i)
		}
		rel := time.Now()
		r.release(cw, cm, mode)
		for {
			e, ok := r.next(quiet)
			if !ok {
				logf("cycle: nothing for %v after %d deliveries", quiet, len(order))
				return order, cw, cm
			}
			if isDelivery(e.m) {
				order = append(order, e.w)
				lats = append(lats, e.t.Sub(rel))
				cw, cm = e.w, e.m
				break
			}
			c, d := status(e.m)
			logf("cycle: %s got %s %s", e.w.name, c, d)
		}
	}
	names := make([]string, len(order))
	for i, w := range order {
		names[i] = w.name
	}
	sort.Slice(lats, func(i, j int) bool { return lats[i] < lats[j] })
	logf("mode %s order: %s", mode, strings.Join(names, " "))
	if len(lats) > 0 {
		logf("mode %s release->delivery latency: min %v median %v max %v", mode,
			lats[0].Round(time.Microsecond), lats[len(lats)/2].Round(time.Microsecond), lats[len(lats)-1].Round(time.Microsecond))
	}
	return order, cw, cm
}

// checkOrder verifies class order and FIFO within a class given the send
// order (waiters' sent times).
func checkOrder(order []*waiter) string {
	viol := 0
	for i := 1; i < len(order); i++ {
		a, b := order[i-1], order[i]
		if a.class > b.class || (a.class == b.class && a.sent.After(b.sent)) {
			viol++
		}
	}
	return fmt.Sprintf("%d deliveries, %d adjacent order violations (class asc, FIFO by send time)", len(order), viol)
}

func single() (*embedded.Server, *nats.Conn) {
	s, err := embedded.Start(embedded.Config{ServerName: "solo"})
	must(err)
	nc, err := nats.Connect(s.URL())
	must(err)
	return s, nc
}

// q1: ordering on one server, for nak, ack-wait expiry and ack+publish.
func q1() {
	s, nc := single()
	defer s.Shutdown()
	for _, mode := range []string{"nak", "expiry", "ackpub"} {
		r := newRig([]*nats.Conn{nc}, "Q1"+mode)
		ackWait := time.Minute
		n5, n0 := 20, 5
		if mode == "expiry" {
			ackWait, n5, n0 = time.Second, 6, 3
		}
		r.setup(1, ackWait, true)
		r.publish()
		hw, hm := r.hold(0)
		for i := range n5 {
			r.newWaiter(fmt.Sprintf("p5-%02d", i), 5, 0, body(5, group, false, 30*time.Second, 5*time.Second)).pull(r.pullSub)
		}
		for i := range n0 {
			r.newWaiter(fmt.Sprintf("p0-%d", i), 0, 0, body(0, group, false, 30*time.Second, 5*time.Second)).pull(r.pullSub)
		}
		must(nc.Flush())
		time.Sleep(100 * time.Millisecond)
		total := n5 + n0
		var hook func(int)
		if mode == "nak" {
			// After the 8th delivery, two new class-0 pulls and one class-9
			// arrive: they must go next (0s) and last (9).
			total += 3
			hook = func(i int) {
				if i == 8 {
					r.newWaiter("late-p0-a", 0, 0, body(0, group, false, 30*time.Second, 5*time.Second)).pull(r.pullSub)
					r.newWaiter("late-p9", 9, 0, body(9, group, false, 30*time.Second, 5*time.Second)).pull(r.pullSub)
					r.newWaiter("late-p0-b", 0, 0, body(0, group, false, 30*time.Second, 5*time.Second)).pull(r.pullSub)
					must(nc.Flush())
					time.Sleep(50 * time.Millisecond)
				}
			}
		}
		order, _, _ := r.cycle(hw, hm, mode, total, 5*time.Second, hook)
		logf("mode %s: %s", mode, checkOrder(order))
	}
}

// q2: pulls without priority, without group, non-JSON, no_wait.
func q2() {
	s, nc := single()
	defer s.Shutdown()
	r := newRig([]*nats.Conn{nc}, "Q2")
	r.setup(1, time.Minute, true)
	r.publish()
	hw, hm := r.hold(0)
	e30, hb := 30*time.Second, 5*time.Second
	// Refusals (each answered at once).
	for _, c := range []struct {
		name string
		b    []byte
	}{
		{"nogroup", body(-1, "", false, e30, hb)},
		{"wronggroup", body(0, "x", false, e30, hb)},
		{"prio10", body(10, group, false, e30, hb)},
		{"natssem-nowait", []byte(`{"batch":1,"no_wait":true}`)},
		{"nowait-g-held", body(3, group, true, 0, 0)},
		{"nowait-g-expires-held", body(3, group, true, 2*time.Second, 0)},
	} {
		w := r.newWaiter(c.name, 0, 0, c.b)
		w.pull(r.pullSub)
		e, ok := r.next(4 * time.Second)
		if !ok {
			logf("%s (%s): no answer in 4s (queued)", c.name, c.b)
			continue
		}
		code, desc := status(e.m)
		logf("%s (%s): %s got %q %q after %v", c.name, c.b, e.w.name, code, desc, e.t.Sub(w.sent).Round(time.Microsecond))
	}
	// Ranking: sent in this order.
	seq := []struct {
		name  string
		class int
		b     []byte
	}{
		{"nonjson-empty", 99, []byte("")},
		{"nonjson-1", 99, []byte("1")},
		{"p9", 9, body(9, group, false, e30, hb)},
		{"p5", 5, body(5, group, false, e30, hb)},
		{"noprio", 0, body(-1, group, false, e30, hb)},
		{"p0", 0, body(0, group, false, e30, hb)},
	}
	for _, c := range seq {
		r.newWaiter(c.name, c.class, 0, c.b).pull(r.pullSub)
	}
	must(nc.Flush())
	time.Sleep(100 * time.Millisecond)
	// A no_wait pull while these wait and the token is held.
	w := r.newWaiter("nowait-while-queued", 0, 0, body(0, group, true, 0, 0))
	w.pull(r.pullSub)
	if e, ok := r.next(3 * time.Second); ok {
		c, d := status(e.m)
		logf("nowait-while-queued: %s got %q %q after %v", e.w.name, c, d, e.t.Sub(w.sent).Round(time.Microsecond))
	}
	order, lw, lm := r.cycle(hw, hm, "nak", len(seq), 3*time.Second, nil)
	logf("ranking: %s", checkOrder(order))
	// Nothing waits now: nak the token, then a no_wait pull at class 9 takes it.
	must(lw.nc.Publish(lm.Reply, []byte("-NAK")))
	must(nc.Flush())
	time.Sleep(100 * time.Millisecond)
	w = r.newWaiter("nowait-p9-free", 9, 0, body(9, group, true, 0, 0))
	w.pull(r.pullSub)
	e, ok := r.next(3 * time.Second)
	if !ok {
		return
	}
	c, d := status(e.m)
	logf("nowait-p9-free: %s got delivery=%v %q %q after %v", e.w.name, isDelivery(e.m), c, d, e.t.Sub(w.sent).Round(time.Microsecond))
	// Races: a waiter queued at class wc; the holder naks and a no_wait
	// pull at class nc2 follows at once on the same connection.
	held := e
	for _, cl := range [][2]int{{5, 0}, {0, 9}} {
		wins := map[string]int{}
		var wq *waiter
		for trial := range 10 {
			if wq == nil {
				wq = r.newWaiter(fmt.Sprintf("wait-p%d-%d", cl[0], trial), cl[0], 0, body(cl[0], group, false, e30, hb))
				wq.pull(r.pullSub)
				must(nc.Flush())
				time.Sleep(20 * time.Millisecond)
			}
			nw := r.newWaiter(fmt.Sprintf("nowait-p%d-%d", cl[1], trial), cl[1], 0, body(cl[1], group, true, 0, 0))
			must(held.w.nc.Publish(held.m.Reply, []byte("-NAK")))
			nw.pull(r.pullSub)
			for got := 0; got < 2; {
				e, ok := r.next(2 * time.Second)
				if !ok {
					break
				}
				c, d := status(e.m)
				switch {
				case isDelivery(e.m) && e.w == wq:
					wins["waiter"]++
					held, wq = e, nil
					got++
				case isDelivery(e.m):
					wins["nowait"]++
					held = e
					got++
				case e.w == nw:
					wins["nowait "+c+" "+d]++
					got++
				default:
					logf("race: %s got %q %q", e.w.name, c, d)
				}
				if got == 1 && wq != nil && e.w == nw && isDelivery(e.m) {
					break // the waiter stays queued
				}
			}
		}
		logf("race waiter p%d vs no_wait p%d right behind the nak, 10 trials: %v", cl[0], cl[1], wins)
	}
}

// q4: creating and updating to prioritized.
func q4() {
	s, nc := single()
	defer s.Shutdown()
	ctx := context.Background()
	r := newRig([]*nats.Conn{nc}, "Q4")
	r.setup(1, time.Minute, true)
	raw, err := nc.Request("$JS.API.CONSUMER.INFO.Q4.holders", nil, 2*time.Second)
	must(err)
	var info struct {
		Config map[string]any `json:"config"`
	}
	must(json.Unmarshal(raw.Data, &info))
	logf("created prioritized: raw info priority_policy=%v priority_groups=%v", info.Config["priority_policy"], info.Config["priority_groups"])
	c, err := r.js.Consumer(ctx, "Q4", "holders")
	must(err)
	logf("created prioritized: jetstream info PriorityPolicy==Prioritized: %v", c.CachedInfo().Config.PriorityPolicy == jetstream.PriorityPolicyPrioritized)
	_, err = r.js.CreateConsumer(ctx, "Q4", jetstream.ConsumerConfig{Durable: "nogroups", AckPolicy: jetstream.AckExplicitPolicy,
		PriorityPolicy: jetstream.PriorityPolicyPrioritized})
	logf("prioritized without groups: err=%v", err)

	// A plain consumer with pulls queued, then updated to prioritized.
	r2 := newRig([]*nats.Conn{nc}, "Q4B")
	r2.setup(1, time.Minute, false)
	r2.publish()
	hw, hm := r2.hold(0)
	for i := range 3 {
		r2.newWaiter(fmt.Sprintf("plain-p5-%d", i), 5, 0, body(5, group, false, 30*time.Second, 5*time.Second)).pull(r2.pullSub)
	}
	must(nc.Flush())
	time.Sleep(100 * time.Millisecond)
	if e, ok := r2.next(500 * time.Millisecond); ok {
		c, d := status(e.m)
		logf("plain consumer, pull with group+priority: %s got %q %q", e.w.name, c, d)
	}
	pc := jetstream.ConsumerConfig{Durable: "holders", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute,
		MaxDeliver: -1, MaxWaiting: 512, MaxAckPending: -1, DeliverPolicy: jetstream.DeliverAllPolicy,
		PriorityPolicy: jetstream.PriorityPolicyPrioritized, PriorityGroups: []string{group}}
	_, err = r2.js.CreateConsumer(ctx, "Q4B", pc)
	logf("CreateConsumer(prioritized) over plain: err=%v", err)
	upd, err := r2.js.UpdateConsumer(ctx, "Q4B", pc)
	if err != nil {
		logf("UpdateConsumer plain->prioritized: err=%v", err)
	} else {
		logf("UpdateConsumer plain->prioritized: ok, info PriorityPolicy=%v groups=%v", upd.CachedInfo().Config.PriorityPolicy == jetstream.PriorityPolicyPrioritized, upd.CachedInfo().Config.PriorityGroups)
		logf("  waiting requests after update: %d", upd.CachedInfo().NumWaiting)
		for i := range 2 {
			r2.newWaiter(fmt.Sprintf("after-p0-%d", i), 0, 0, body(0, group, false, 30*time.Second, 5*time.Second)).pull(r2.pullSub)
		}
		r2.newWaiter("after-nonjson", 99, 0, nil).pull(r2.pullSub)
		must(nc.Flush())
		time.Sleep(100 * time.Millisecond)
		order, _, _ := r2.cycle(hw, hm, "nak", 6, 2*time.Second, nil)
		logf("after update: %s", checkOrder(order))
	}
	pc.PriorityPolicy, pc.PriorityGroups = jetstream.PriorityPolicyNone, nil
	_, err = r2.js.UpdateConsumer(ctx, "Q4B", pc)
	logf("UpdateConsumer prioritized->none: err=%v", err)
}

// q3: R3 cluster ordering and consumer-leader failover.
func q3() {
	dir, err := os.MkdirTemp("", "prionats-*")
	must(err)
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := natstest.StartCluster(ctx, 3, dir)
	must(err)
	defer c.Shutdown()
	logf("cluster up")
	var conns []*nats.Conn
	for i := range 3 {
		nc, err := nats.Connect("nats://"+c.Addr(i), nats.MaxReconnects(-1))
		must(err)
		conns = append(conns, nc)
	}
	r := newRig(conns, "Q3")
	r.setup(3, time.Minute, true)
	cons, err := r.js.Consumer(ctx, "Q3", "holders")
	must(err)
	leaderName := cons.CachedInfo().Cluster.Leader
	leader := int(leaderName[1] - '0')
	logf("consumer leader %s, config num_replicas %d, cluster replicas %d", leaderName, cons.CachedInfo().Config.Replicas, len(cons.CachedInfo().Cluster.Replicas))
	holderNode := (leader + 1) % 3
	r.publish()
	hw, hm := r.hold(holderNode)
	e30, hb := 30*time.Second, 5*time.Second
	// Ordering across nodes: 9 p5 then 6 p0, round-robin over the nodes,
	// 20 ms apart so that they reach the leader in send order.
	for i := range 9 {
		r.newWaiter(fmt.Sprintf("p5-%d@n%d", i, i%3), 5, i%3, body(5, group, false, e30, hb)).pull(r.pullSub)
		time.Sleep(20 * time.Millisecond)
	}
	for i := range 6 {
		r.newWaiter(fmt.Sprintf("p0-%d@n%d", i, i%3), 0, i%3, body(0, group, false, e30, hb)).pull(r.pullSub)
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	order, hw, hm := r.cycle(hw, hm, "nak", 15, 5*time.Second, nil)
	logf("R3 ordering: %s", checkOrder(order))
	// The token is held by the last waiter; move it to a holder on a
	// surviving node: nak it into a fresh holder pull.
	h2 := r.newWaiter("holder2", 0, holderNode, body(0, group, false, e30, hb))
	h2.pull(r.pullSub)
	time.Sleep(50 * time.Millisecond)
	must(hw.nc.Publish(hm.Reply, []byte("-NAK")))
	var hm2 *nats.Msg
	for hm2 == nil {
		e, ok := r.next(5 * time.Second)
		if !ok {
			must(fmt.Errorf("holder2 got nothing"))
		}
		if e.w == h2 && isDelivery(e.m) {
			hm2 = e.m
		}
	}
	// Failover: 9 p5 + 6 p0 waiting, spread over all nodes.
	r.waiters = nil
	var fw []*waiter
	for i := range 9 {
		w := r.newWaiter(fmt.Sprintf("F-p5-%d@n%d", i, i%3), 5, i%3, body(5, group, false, e30, hb))
		w.pull(r.pullSub)
		fw = append(fw, w)
		time.Sleep(10 * time.Millisecond)
	}
	for i := range 6 {
		w := r.newWaiter(fmt.Sprintf("F-p0-%d@n%d", i, i%3), 0, i%3, body(0, group, false, e30, hb))
		w.pull(r.pullSub)
		fw = append(fw, w)
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	// Three pulls sent right before the stop, no pause.
	for i := range 3 {
		n := (leader + 1 + i%2) % 3
		if i == 2 {
			n = leader
		}
		w := r.newWaiter(fmt.Sprintf("F-late-p0-%d@n%d", i, n), 0, n, body(0, group, false, e30, hb))
		fw = append(fw, w)
	}
	for _, w := range fw[15:] {
		w.pull(r.pullSub)
	}
	stop := time.Now()
	// Pulls sent while leadership moves: every 10 ms for 100 ms, from
	// each connection in turn, at class 3.
	var during []*waiter
	for i := range 10 {
		n := i % 3
		during = append(during, r.newWaiter(fmt.Sprintf("D-p3-%d@n%d", i, n), 3, n, body(3, group, false, e30, hb)))
	}
	duringDone := make(chan struct{})
	go func() {
		defer close(duringDone)
		for _, w := range during {
			time.Sleep(10 * time.Millisecond)
			w.sent = time.Now()
			_ = w.nc.PublishRequest(r.pullSub, w.inbox, w.body)
		}
	}()
	defer func() { <-duringDone }()
	if *failMode == "stepdown" {
		logf("consumer leader n%d steps down", leader)
		resp, err := conns[holderNode].Request("$JS.API.CONSUMER.LEADER.STEPDOWN.Q3.holders", nil, 5*time.Second)
		must(err)
		logf("stepdown answered after %v: %s", time.Since(stop).Round(time.Millisecond), resp.Data)
	} else {
		logf("stopping consumer leader n%d", leader)
		c.Stop(leader)
		logf("Stop returned after %v", time.Since(stop).Round(time.Millisecond))
	}
	// Observe 12 s (> 2 heartbeats): a 409 makes the waiter re-pull at its class.
	first := map[*waiter]time.Duration{}
	repulled := map[*waiter]time.Time{}
	deadline := time.Now().Add(12 * time.Second)
	for time.Now().Before(deadline) {
		e, ok := r.next(time.Until(deadline))
		if !ok {
			break
		}
		code, desc := status(e.m)
		if _, seen := first[e.w]; !seen {
			first[e.w] = e.t.Sub(stop)
		}
		logf("  %s: %q %q at +%v", e.w.name, code, desc, e.t.Sub(stop).Round(time.Millisecond))
		if code == "409" || code == "408" {
			e.w.pull(r.pullSub)
			repulled[e.w] = time.Now()
		}
		if code == "503" { // as natssem: ask again after a pause
			w := e.w
			time.AfterFunc(100*time.Millisecond, func() { w.pull(r.pullSub) })
		}
		if isDelivery(e.m) {
			logf("  unexpected delivery to %s", e.w.name)
		}
	}
	<-duringDone
	fw = append(fw, during...)
	var stranded []string
	for _, w := range fw {
		w.mu.Lock()
		logf("  %s: sent +%v first answer %v, heartbeats %d (last at +%v), got %v", w.name, w.sent.Sub(stop).Round(time.Millisecond), first[w], w.hbs,
			w.lastHB.Sub(stop).Round(time.Millisecond), w.got)
		if _, ok := first[w]; !ok && w.hbs == 0 {
			stranded = append(stranded, w.name)
		}
		w.mu.Unlock()
	}
	logf("stranded (no status and no heartbeat in 12 s): %v", stranded)
	for _, w := range fw {
		if _, ok := first[w]; !ok && w.hbs == 0 {
			w.pull(r.pullSub) // natssem's silence rule re-pulls these now
		}
	}
	for i, nc := range conns {
		logf("conn %d now on %s status %v", i, nc.ConnectedUrl(), nc.Status())
	}
	time.Sleep(300 * time.Millisecond)
	js2, _ := jetstream.New(conns[holderNode])
	if ci, err := js2.Consumer(ctx, "Q3", "holders"); err == nil {
		logf("new consumer leader %s, waiting %d", ci.CachedInfo().Cluster.Leader, ci.CachedInfo().NumWaiting)
	}
	order, _, _ = r.cycle(h2, hm2, "nak", len(fw), 5*time.Second, nil)
	logf("after failover: %s", checkOrder(order))
	// Class order ignoring FIFO (FIFO is by re-pull time, not original send).
	inv := 0
	for i := 1; i < len(order); i++ {
		if order[i-1].class > order[i].class {
			inv++
		}
	}
	logf("after failover: class inversions %d", inv)
}

var consReplicas = flag.Int("crep", 0, "consumer Replicas (0: inherit the stream's)")

var failMode = flag.String("fail", "stop", "q3: stop or stepdown")

func main() {
	q := flag.Int("q", 1, "question 1..4")
	flag.Parse()
	switch *q {
	case 1:
		q1()
	case 2:
		q2()
	case 3:
		q3()
	case 4:
		q4()
	}
}

// Command prioexp runs one consumer-priority experiment against RabbitMQ
// quorum queues: one token message, a holder, and waiters that consume it
// with prefetch (default 1), manual ack and an optional x-priority, each on
// its own channel, subscribed one after the other in spec order. The token
// is passed along: each receiver records itself, then gives it back (see
// -mode) and the next delivery is awaited.
//
// The runs behind docs/notes/priority-brokers.md (U = cluster 2's URLs,
// TOKENSEM_RMQ_CLUSTER=2 bash .ci/rabbitmq-cluster.sh urls):
//
//	go run . -queue prio-exp-q1 -spec 20x1,5x10 -holder 100 -first stay -mode cancel
//	go run . -queue prio-exp-q1 -spec 20x1,5x10 -holder 10 -first stay -mode close -quiet
//	go run . -queue prio-exp-lat -spec 300xn -holder n -first cancelwait -mode cancelwait
//	go run . -queue prio-exp-lat -spec 300x%10 -holder n -first cancelwait -mode cancelwait
//	go run . -urls "$U" -queue prio-exp-c -spec 3x1,3x5,3x10,3x1,3x5,3x10 -holder n -holder-node 1 \
//		-first cancel -mode cancel -hook "./hook-transfer.sh prio-exp-c" -hook-at 5 -settle 2s
//	go run . -queue prio-exp-q4 -spec 2x-1,1xc,1x1,1x-1 -holder n
//
// A spec AxP is A waiters at x-priority P (n: none; c: a census-like
// consumer, prefetch 100, no x-priority; %K: each waiter at its id mod K).
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

type waiter struct {
	id       int // subscription order, 0 = holder
	prio     *int
	prefetch int
	census   bool // gives the token back without cancelling, up to 3 times
	node     int
	conn     *amqp.Connection
	ch       *amqp.Channel
	tag      string
	del      <-chan amqp.Delivery
	got      int
	lost     atomic.Bool // its connection or channel closed before it was served
	done     bool
}

func (w *waiter) label() string {
	p := "n"
	if w.prio != nil {
		p = strconv.Itoa(*w.prio)
	}
	s := fmt.Sprintf("#%d(p%s", w.id, p)
	if w.census {
		s += ",census"
	}
	return s + fmt.Sprintf(",node%d)", w.node)
}

func (w *waiter) eff() int {
	if w.prio == nil {
		return 0
	}
	return *w.prio
}

type event struct {
	w *waiter
	d amqp.Delivery
	t time.Time
}

var (
	urlsF    = flag.String("urls", "amqp://guest:guest@127.0.0.1:5672/", "comma-separated AMQP URLs; waiter i uses url i%len")
	queueF   = flag.String("queue", "prio-exp-order", "queue name (must start with prio-exp-)")
	specF    = flag.String("spec", "20x1,5x10", "waiters in subscription order: COUNTxPRIO, PRIO = int, n (no x-priority), c (census: prefetch 100, no x-priority), %M (index mod M)")
	holderF  = flag.String("holder", "n", "holder's x-priority (int or n)")
	holderN  = flag.Int("holder-node", 0, "url index of the holder")
	firstF   = flag.String("first", "cancel", "holder's first release: stay (Reject, still subscribed), cancel (Cancel noWait + Reject), close (close channel)")
	modeF    = flag.String("mode", "cancel", "waiters' release: cancel (Cancel noWait + Reject, as amqpsem), cancelwait (Cancel, wait cancel-ok, then Reject; latency measured from Reject), close")
	hookF    = flag.String("hook", "", "bash command run while the token is held, after -hook-at handoffs")
	hookAt   = flag.Int("hook-at", 0, "handoffs done before the hook runs")
	settleF  = flag.Duration("settle", 3*time.Second, "pause after the hook")
	waitF    = flag.Duration("wait", 5*time.Second, "give up waiting for the next delivery after this")
	quietF   = flag.Bool("quiet", false, "do not print each handoff")
	keepLast = flag.Bool("keep-queue", false, "do not delete the queue at the end")
)

func main() {
	flag.Parse()
	log.SetFlags(log.Ltime | log.Lmicroseconds)
	if !strings.HasPrefix(*queueF, "prio-exp-") {
		log.Fatal("queue name must start with prio-exp-")
	}
	urls := strings.Split(*urlsF, ",")
	conns := make([]*amqp.Connection, len(urls))
	for i, u := range urls {
		c, err := amqp.Dial(u)
		if err != nil {
			log.Fatalf("dial %s: %v", u, err)
		}
		conns[i] = c
	}
	defer cleanup(urls, conns)

	// The queue: fresh, durable, quorum, one persistent token (confirmed).
	ch, err := conns[0].Channel()
	must(err)
	_, _ = ch.QueueDelete(*queueF, false, false, false)
	_, err = ch.QueueDeclare(*queueF, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	must(err)
	must(ch.Confirm(false))
	conf, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", *queueF, false, false,
		amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte("token")})
	must(err)
	if ok, err := conf.WaitContext(context.Background()); !ok || err != nil {
		log.Fatalf("publish not confirmed: %v %v", ok, err)
	}
	_ = ch.Close()

	events := make(chan event, 1024)
	holder := &waiter{id: 0, prio: parsePrio(*holderF), prefetch: 1, node: *holderN % len(conns)}
	subscribe(holder, conns, events)
	var cur event
	select {
	case cur = <-events:
	case <-time.After(*waitF):
		log.Fatal("holder got no token")
	}
	log.Printf("holder %s holds the token", holder.label())

	ws := parseSpec(*specF, len(conns))
	t0 := time.Now()
	for _, w := range ws {
		subscribe(w, conns, events)
	}
	log.Printf("subscribed %d waiters in %v", len(ws), time.Since(t0).Round(time.Millisecond))

	var order []*waiter
	var lat []time.Duration
	handoffs := 0
	for {
		if *hookF != "" && handoffs == *hookAt {
			log.Printf("hook (token held by %s): %s", cur.w.label(), *hookF)
			cmd := exec.Command("bash", "-c", *hookF)
			cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
			if err := cmd.Run(); err != nil {
				log.Printf("hook failed: %v", err)
			}
			time.Sleep(*settleF)
			alive := 0
			for _, w := range ws {
				if !w.lost.Load() {
					alive++
				}
			}
			log.Printf("after hook: %d of %d waiters still subscribed", alive, len(ws))
		}
		w := cur.w
		how := *modeF
		switch {
		case w == holder && handoffs == 0:
			how = *firstF
		case w.census && w.got <= 3:
			how = "stay"
		}
		start, err := release(w, cur.d, how)
		if err != nil {
			log.Printf("release by %s (%s) failed: %v", w.label(), how, err)
			break
		}
		handoffs++
		select {
		case next := <-events:
			next.w.got++
			order = append(order, next.w)
			l := next.t.Sub(start)
			lat = append(lat, l)
			if !*quietF {
				log.Printf("%3d: %s released (%s) -> %s after %v", handoffs, w.label(), how, next.w.label(), l.Round(time.Microsecond))
			}
			cur = next
		case <-time.After(*waitF):
			log.Printf("no delivery within %v after %s released (%s): end", *waitF, w.label(), how)
			goto report
		}
	}
report:
	report(ws, order, lat)
}

func release(w *waiter, d amqp.Delivery, how string) (time.Time, error) {
	switch how {
	case "stay":
		t := time.Now()
		return t, w.ch.Reject(d.DeliveryTag, true)
	case "cancel":
		w.done = true
		if err := w.ch.Cancel(w.tag, true); err != nil {
			return time.Time{}, err
		}
		t := time.Now()
		return t, w.ch.Reject(d.DeliveryTag, true)
	case "cancelwait":
		w.done = true
		if err := w.ch.Cancel(w.tag, false); err != nil {
			return time.Time{}, err
		}
		t := time.Now()
		return t, w.ch.Reject(d.DeliveryTag, true)
	case "close":
		w.done = true
		t := time.Now()
		return t, w.ch.Close()
	}
	return time.Time{}, fmt.Errorf("unknown release %q", how)
}

func subscribe(w *waiter, conns []*amqp.Connection, events chan<- event) {
	w.conn = conns[w.node]
	ch, err := w.conn.Channel()
	must(err)
	must(ch.Qos(w.prefetch, 0, false))
	var args amqp.Table
	if w.prio != nil {
		args = amqp.Table{"x-priority": int32(*w.prio)}
	}
	w.ch, w.tag = ch, fmt.Sprintf("prio-exp-%d", w.id)
	w.del, err = ch.Consume(*queueF, w.tag, false, false, false, false, args)
	must(err)
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	go func() {
		for d := range w.del {
			events <- event{w: w, d: d, t: time.Now()}
		}
	}()
	go func() {
		if e := <-closed; e != nil && !w.done {
			w.lost.Store(true)
		}
	}()
}

func parsePrio(s string) *int {
	if s == "n" || s == "c" {
		return nil
	}
	p, err := strconv.Atoi(s)
	must(err)
	return &p
}

func parseSpec(spec string, nconn int) []*waiter {
	var ws []*waiter
	for _, item := range strings.Split(spec, ",") {
		cnt, p, ok := strings.Cut(item, "x")
		if !ok {
			log.Fatalf("bad spec item %q", item)
		}
		n, err := strconv.Atoi(cnt)
		must(err)
		for i := 0; i < n; i++ {
			w := &waiter{id: len(ws) + 1, prefetch: 1}
			w.node = (w.id - 1) % nconn
			switch {
			case p == "c":
				w.census, w.prefetch = true, 100
			case strings.HasPrefix(p, "%"):
				m, err := strconv.Atoi(p[1:])
				must(err)
				v := i % m
				w.prio = &v
			default:
				w.prio = parsePrio(p)
			}
			ws = append(ws, w)
		}
	}
	return ws
}

func report(ws []*waiter, order []*waiter, lat []time.Duration) {
	// Expected: strict priority, FIFO by subscription within a band, among
	// the waiters not lost before being served.
	var exp []*waiter
	for _, w := range ws {
		if !w.lost.Load() || w.got > 0 {
			exp = append(exp, w)
		}
	}
	sort.SliceStable(exp, func(i, j int) bool { return exp[i].eff() > exp[j].eff() })
	ids := func(s []*waiter) string {
		var b strings.Builder
		for i, w := range s {
			if i > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(&b, "%d", w.id)
		}
		return b.String()
	}
	fmt.Printf("served order (waiter ids, 0 = holder): %s\n", ids(order))
	fmt.Printf("expected (strict prio, FIFO in band):  %s\n", ids(exp))
	lost := 0
	for _, w := range ws {
		if w.lost.Load() && w.got == 0 {
			lost++
		}
	}
	// Compare the first deliveries of each waiter with the expectation.
	var firsts []*waiter
	seen := map[*waiter]bool{}
	for _, w := range order {
		if !seen[w] && w.id != 0 {
			seen[w] = true
			firsts = append(firsts, w)
		}
	}
	match := ids(firsts) == ids(exp[:min(len(exp), len(firsts))])
	fmt.Printf("handoffs=%d distinct-waiters-served=%d/%d lost(conn/channel closed)=%d first-delivery order matches expected prefix: %v\n",
		len(order), len(firsts), len(ws), lost, match)
	if len(lat) > 0 {
		s := slices.Clone(lat)
		slices.Sort(s)
		var sum time.Duration
		for _, l := range s {
			sum += l
		}
		q := func(f float64) time.Duration { return s[int(f*float64(len(s)-1))].Round(time.Microsecond) }
		fmt.Printf("release->delivery latency: n=%d min=%v p50=%v p90=%v max=%v mean=%v\n",
			len(s), q(0), q(0.5), q(0.9), q(1), (sum / time.Duration(len(s))).Round(time.Microsecond))
	}
}

func cleanup(urls []string, conns []*amqp.Connection) {
	if *keepLast {
		return
	}
	for i, u := range urls {
		c := conns[i]
		if c.IsClosed() {
			var err error
			if c, err = amqp.Dial(u); err != nil {
				continue
			}
		}
		ch, err := c.Channel()
		if err != nil {
			continue
		}
		n, err := ch.QueueDelete(*queueF, false, false, false)
		if err == nil {
			log.Printf("deleted queue %s (%d messages) via %s", *queueF, n, u)
			_ = c.Close()
			break
		}
	}
	for _, c := range conns {
		_ = c.Close()
	}
}

func must(err error) {
	if err != nil {
		log.Fatal(err)
	}
}

package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// setMeterChildEnv, when set to a host:port, turns the test binary into the
// child command of the weighted and hierarchy tests: it reports every
// permit seminit exec gave it (TOKENSEM_NAMES, _SLOTS, _FENCES) to a
// setMeter.
const setMeterChildEnv = "SEMINIT_TEST_SET_METER_CHILD"

func setMeterChild(addr string) int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "set meter child:", err)
		return 3
	}
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return fail(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	r := bufio.NewReader(c)
	for _, msg := range []string{
		fmt.Sprintf("enter %s %s %s", os.Getenv("TOKENSEM_NAMES"), os.Getenv("TOKENSEM_SLOTS"), os.Getenv("TOKENSEM_FENCES")),
		"leave",
	} {
		if _, err := fmt.Fprintln(c, msg); err != nil {
			return fail(err)
		}
		if reply, err := r.ReadString('\n'); err != nil || reply != "ok\n" {
			return fail(fmt.Errorf("meter replied %q, %v to %q", reply, err, msg))
		}
		time.Sleep(20 * time.Millisecond)
	}
	return 0
}

// setMeter counts, per semaphore, the permits the set meter children hold
// inside their critical sections. Like meter, it answers an "enter" only
// once every semaphore the child holds is full (or fillWait has passed), so
// that holders provably overlap on a loaded machine.
type setMeter struct {
	l       net.Listener
	wg      sync.WaitGroup
	permits map[string]int

	mu       sync.Mutex
	changed  *sync.Cond
	inside   map[string]int
	max      map[string]int
	held     map[string]bool   // "name/slot" held now
	fences   map[string]uint64 // last fence per "name/slot"
	enters   int
	children int // children inside now
	crowd    int // most children inside at once
	problems []string
}

func startSetMeter(t *testing.T, permits map[string]int) *setMeter {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := &setMeter{l: l, permits: permits, inside: map[string]int{}, max: map[string]int{},
		held: map[string]bool{}, fences: map[string]uint64{}}
	m.changed = sync.NewCond(&m.mu)
	m.wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			m.wg.Go(func() { m.serve(c) })
		}
	})
	t.Cleanup(func() { _ = l.Close(); m.wg.Wait() })
	return m
}

func (m *setMeter) serve(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	var mine []string // "name/slot" this child holds
	defer func() {
		m.mu.Lock()
		m.leave(mine)
		m.mu.Unlock()
	}()
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		m.mu.Lock()
		switch {
		case len(f) == 4 && f[0] == "enter":
			mine = m.enter(f[1], f[2], f[3])
			m.waitFull(mine)
		case len(f) == 1 && f[0] == "leave":
			m.leave(mine)
			mine = nil
		default:
			m.problems = append(m.problems, fmt.Sprintf("unknown message %q", sc.Text()))
		}
		m.mu.Unlock()
		if _, err := c.Write([]byte("ok\n")); err != nil {
			return
		}
	}
}

// enter records the permits of one child; m.mu is held.
func (m *setMeter) enter(names, slots, fences string) []string {
	n, s, f := strings.Split(names, ","), strings.Split(slots, ","), strings.Split(fences, ",")
	if len(n) != len(s) || len(n) != len(f) {
		m.problems = append(m.problems, fmt.Sprintf("names %q, slots %q, fences %q differ in length", names, slots, fences))
		return nil
	}
	m.enters++
	var mine []string
	for i := range n {
		slot, err1 := strconv.Atoi(s[i])
		fence, err2 := strconv.ParseUint(f[i], 10, 64)
		key := n[i] + "/" + s[i]
		switch {
		case err1 != nil || err2 != nil || slot < 0 || slot >= m.permits[n[i]]:
			m.problems = append(m.problems, fmt.Sprintf("bad permit %s fence %q", key, f[i]))
			continue
		case m.held[key]:
			m.problems = append(m.problems, fmt.Sprintf("slot %s held twice at once", key))
		case fence <= m.fences[key]:
			m.problems = append(m.problems, fmt.Sprintf("slot %s: fence %d after %d", key, fence, m.fences[key]))
		}
		m.held[key] = true
		m.fences[key] = max(m.fences[key], fence)
		m.inside[n[i]]++
		m.max[n[i]] = max(m.max[n[i]], m.inside[n[i]])
		mine = append(mine, key)
	}
	if len(mine) > 0 { // as leave counts it
		m.children++
		m.crowd = max(m.crowd, m.children)
	}
	m.changed.Broadcast()
	return mine
}

func (m *setMeter) leave(mine []string) {
	if len(mine) > 0 {
		m.children--
	}
	for _, key := range mine {
		name, _, _ := strings.Cut(key, "/")
		m.inside[name]--
		delete(m.held, key)
	}
	m.changed.Broadcast()
}

// waitFull waits, m.mu held, until every semaphore of mine is full or
// fillWait passes.
func (m *setMeter) waitFull(mine []string) {
	full := func() bool {
		for _, key := range mine {
			name, _, _ := strings.Cut(key, "/")
			if m.inside[name] < m.permits[name] {
				return false
			}
		}
		return true
	}
	expired := false
	timer := time.AfterFunc(fillWait, func() {
		m.mu.Lock()
		expired = true
		m.changed.Broadcast()
		m.mu.Unlock()
	})
	defer timer.Stop()
	for !full() && !expired {
		m.changed.Wait()
	}
}

// runExecs starts one seminit exec per entry of argsOf (the flags before
// "--"), all at once, each running the set meter child, and fails the test
// for any that does not exit 0.
func runExecs(t *testing.T, b broker, m *setMeter, argsOf [][]string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	env := b.env(setMeterChildEnv+"="+m.l.Addr().String(),
		"GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	results := make([]result, len(argsOf))
	var wg sync.WaitGroup
	start := time.Now()
	for i, args := range argsOf {
		wg.Go(func() {
			p := startSeminit(t, env, append(append([]string{"exec"}, args...), "--wait", "60s", "--", self)...)
			select {
			case <-p.done:
				results[i] = p.res
			case <-time.After(90 * time.Second):
				results[i] = result{code: -2, stderr: "still running after 90s"}
			}
		})
	}
	wg.Wait()
	t.Logf("%d exec runs took %v", len(argsOf), time.Since(start).Round(time.Millisecond))
	for i, r := range results {
		if r.code != exitOK {
			t.Errorf("exec %v: %v", argsOf[i], r)
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, p := range m.problems {
		t.Error(p)
	}
	if m.enters != len(argsOf) {
		t.Errorf("%d children entered, want %d", m.enters, len(argsOf))
	}
}

// TestExecWeighted: N=4, 12 concurrent seminit exec of weights 3, 2 and 1
// never hold more than 4 permits' weight inside, run side by side, and all
// finish; a weight above the permits exits 64 at once.
//
// Reaching exactly 4 inside is not promised: waiters are served in order,
// and each child stays inside until the permits are full or fillWait
// passes, so an order like 3, 2, 3, 2, ... (a 2 cannot join a 3; a 3 cannot
// join a 2) keeps 3 or 2 inside at a time. One loaded run in 25 drew such
// an order (max 3 of 4, 9 fill waits). Running side by side is promised by
// the four 1s: whoever is inside, a 1 behind it fits beside it.
func TestExecWeighted(t *testing.T) {
	t.Parallel()
	forEachBroker(t, testExecWeighted)
}

func testExecWeighted(t *testing.T, b broker) {
	const permits = 4
	name := uniqueName(t)
	b.mustInit(t, name, permits)
	t.Cleanup(func() { b.seminit(t, "delete", "--name", name, "--force") })

	start := time.Now()
	if r := b.seminit(t, "exec", "--name", name, "--weight", "5", "--", "true"); r.code != exitUsage || !strings.Contains(r.stderr, "weight") {
		t.Fatalf("exec --weight 5 on 4 permits: %v, want exit %d naming the weight", r, exitUsage)
	}
	t.Logf("--weight 5 refused in %v", time.Since(start).Round(time.Millisecond))

	m := startSetMeter(t, map[string]int{name: permits})
	var argsOf [][]string
	for i := range 12 {
		argsOf = append(argsOf, []string{"--name", name, "--weight", strconv.Itoa(3 - i%3)})
	}
	runExecs(t, b, m, argsOf)
	m.mu.Lock()
	defer m.mu.Unlock()
	t.Logf("weight inside at most %d of %d; at most %d execs inside at once", m.max[name], permits, m.crowd)
	if m.max[name] > permits {
		t.Errorf("weight inside reached %d, more than %d", m.max[name], permits)
	}
	if m.crowd < 2 {
		t.Errorf("at most %d exec inside at once: the weighted permits were never shared", m.crowd)
	}
}

// TestExecHierarchy: regions eu (2) and us (2) under global (3); each of
// 12 seminit exec holds one permit of its region and one of global, half
// of them naming global first. Nothing deadlocks, every run finishes, and
// eu, us and global never have more than 2, 2 and 3 inside.
func TestExecHierarchy(t *testing.T) {
	t.Parallel()
	forEachBroker(t, testExecHierarchy)
}

func testExecHierarchy(t *testing.T, b broker) {
	eu, us, global := uniqueName(t), uniqueName(t), uniqueName(t)
	limits := map[string]int{eu: 2, us: 2, global: 3}
	for name, n := range limits {
		b.mustInit(t, name, n)
		t.Cleanup(func() { b.seminit(t, "delete", "--name", name, "--force") })
	}
	m := startSetMeter(t, limits)
	var argsOf [][]string
	for i := range 12 {
		region := eu
		if i%2 == 1 {
			region = us
		}
		if i%4 < 2 {
			argsOf = append(argsOf, []string{"--name", region, "--name", global})
		} else {
			argsOf = append(argsOf, []string{"--name", global, "--name", region})
		}
	}
	runExecs(t, b, m, argsOf)
	m.mu.Lock()
	defer m.mu.Unlock()
	t.Logf("inside at most: eu %d, us %d, global %d", m.max[eu], m.max[us], m.max[global])
	for name, n := range limits {
		if m.max[name] > n {
			t.Errorf("%d inside %s, limit %d", m.max[name], name, n)
		}
	}
	if m.max[global] != limits[global] {
		t.Errorf("global reached %d, want %d", m.max[global], limits[global])
	}
}

// TestExecWeightedKilled kills -9 a seminit exec holding all 3 permits,
// then one that has gathered 2 of 3 (and the gate) and waits for the third:
// every permit, and the gate, come back (NATS: within the lease; RabbitMQ:
// when the broker sees the connection drop), so the next caller of all 3 is
// served.
func TestExecWeightedKilled(t *testing.T) {
	t.Parallel()
	forEachBroker(t, testExecWeightedKilled)
}

func testExecWeightedKilled(t *testing.T, b broker) {
	const permits, lease = 3, 2 * time.Second
	name := uniqueName(t)
	bound := 5 * time.Second
	if b.leases {
		b.mustInit(t, name, permits, "--lease", lease.String())
		bound = 15 * time.Second
	} else {
		b.mustInit(t, name, permits)
	}
	t.Cleanup(func() { b.seminit(t, "delete", "--name", name, "--force") })
	weight := strconv.Itoa(permits)

	recover := func(what string, killed time.Time) {
		t.Helper()
		r := b.seminit(t, "exec", "--name", name, "--weight", weight, "--wait", "20s", "--", "true")
		back := time.Since(killed)
		if r.code != exitOK {
			t.Fatalf("exec --weight %s after kill -9 of %s: %v", weight, what, r)
		}
		t.Logf("%s: all %d permits back %v after kill -9 of %s", b.name, permits, back.Round(time.Millisecond), what)
		if back > bound {
			t.Errorf("recovery took %v, want at most %v", back, bound)
		}
	}

	p, _ := b.holder(t, name, 30, "--weight", weight)
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	recover("a holder of all of them", time.Now())

	// A gatherer with 2 of 3: one permit is held by another exec.
	h, _ := b.holder(t, name, 60)
	g := startSeminit(t, b.env(), "exec", "--name", name, "--weight", weight, "--wait", "60s", "--", "true")
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, st := b.statusJSON(t, name); st.Held == permits && st.Waiting >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the gatherer never held 2 permits while waiting for a third")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := g.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	if err := h.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if r := h.wait(15 * time.Second); r.code == -2 {
		t.Fatalf("the single holder did not exit on SIGTERM: %v", r)
	}
	recover("a gatherer holding 2 of them", killed)
	_, st := b.statusJSON(t, name)
	if !st.Healthy || st.Held != 0 || st.Available != permits {
		t.Errorf("status after recovery = %+v", st)
	}
}

// TestExecHierarchyOppositeOrders: three semaphores of one permit each,
// driven by two streams of seminit exec processes, one naming them a, b, c
// and the other c, b, a, until both streams have run oppositeOrderExecs (or
// a minute has passed). Taken in the order given, the two would soon each
// hold one and wait for the other's; taken in one canonical order, every
// exec finishes and no semaphore ever has two holders.
func TestExecHierarchyOppositeOrders(t *testing.T) {
	t.Parallel()
	forEachBroker(t, func(t *testing.T, b broker) {
		t.Parallel()
		testExecHierarchyOppositeOrders(t, b)
	})
}

// oppositeOrderExecs is how many execs each stream of
// TestExecHierarchyOppositeOrders runs at least, the other stream running
// beside it all along (beside two CPU hogs, a stream ran 97 in a minute on
// NATS and 242 on RabbitMQ).
const oppositeOrderExecs = 60

func testExecHierarchyOppositeOrders(t *testing.T, b broker) {
	const run = time.Minute
	names := []string{uniqueName(t), uniqueName(t), uniqueName(t)}
	limits := map[string]int{}
	for _, name := range names {
		b.mustInit(t, name, 1)
		limits[name] = 1
		t.Cleanup(func() { b.seminit(t, "delete", "--name", name, "--force") })
	}
	m := startSetMeter(t, limits)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	env := b.env(setMeterChildEnv+"="+m.l.Addr().String(),
		"GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	orders := [][]string{
		{"--name", names[0], "--name", names[1], "--name", names[2]},
		{"--name", names[2], "--name", names[1], "--name", names[0]},
	}
	deadline := time.Now().Add(run)
	runs := make([]int, len(orders))
	var done [2]atomic.Int64 // runs, read by the other stream
	var wg sync.WaitGroup
	for i, order := range orders {
		wg.Go(func() {
			// Until both streams have run their count: the faster one goes
			// on beside the slower one.
			for (done[0].Load() < oppositeOrderExecs || done[1].Load() < oppositeOrderExecs) && time.Now().Before(deadline) {
				args := append(append([]string{"exec"}, order...), "--wait", "30s", "--", self)
				p := startSeminit(t, env, args...)
				var r result
				select {
				case <-p.done:
					r = p.res
				case <-time.After(45 * time.Second):
					r = result{code: -2, stderr: "still running after 45s"}
				}
				if r.code != exitOK {
					t.Errorf("stream %d, exec %d (%v): %v", i, runs[i], order, r)
					return
				}
				runs[i]++
				done[i].Add(1)
			}
		})
	}
	wg.Wait()
	t.Logf("%s: %d and %d execs in %v, every one finished", b.name, runs[0], runs[1], time.Since(deadline.Add(-run)).Round(time.Millisecond))
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, p := range m.problems {
		t.Error(p)
	}
	for _, name := range names {
		if m.max[name] != 1 {
			t.Errorf("%d inside %s at most, want 1", m.max[name], name)
		}
	}
	if runs[0] == 0 || runs[1] == 0 {
		t.Errorf("a stream ran no exec: %v", runs)
	}
}

package chaos

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/tokensem/tokensem/internal/faultproxy"
)

// profile sizes a chaos run: TOKENSEM_CHAOS=long runs the long one,
// TOKENSEM_CHAOS=off none; the short one runs by default (CI).
type profile struct {
	name     string
	duration time.Duration // of fault injection, per scenario
	workers  int
	permits  int
	every    time.Duration // mean time between faults
}

func chosenProfile(t *testing.T) profile {
	switch p := os.Getenv("TOKENSEM_CHAOS"); p {
	case "", "short":
		return profile{name: "short", duration: 20 * time.Second, workers: 6, permits: 3, every: 700 * time.Millisecond}
	case "long":
		return profile{name: "long", duration: 5 * time.Minute, workers: 10, permits: 4, every: 500 * time.Millisecond}
	case "off":
		t.Skip("TOKENSEM_CHAOS=off")
	default:
		t.Fatalf("TOKENSEM_CHAOS=%q: want short, long or off", p)
	}
	return profile{}
}

// meter collects the workers' reports: the history.
type meter struct {
	ln      net.Listener
	mu      sync.Mutex
	reports []Report
	holding map[int]int      // worker -> slot it holds now
	since   map[int]int64    // worker -> when it acquired what it holds
	until   map[int]int64    // worker -> the deadline of what it holds (NATS)
	conns   map[int]net.Conn // worker -> its connection, once it reported
	wg      sync.WaitGroup
}

func startMeter(t *testing.T) *meter {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := &meter{ln: ln, holding: map[int]int{}, since: map[int]int64{}, until: map[int]int64{}, conns: map[int]net.Conn{}}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			m.wg.Add(1)
			go func() {
				defer m.wg.Done()
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					var r Report
					if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
						continue
					}
					m.mu.Lock()
					m.conns[r.Worker] = c
					m.reports = append(m.reports, r)
					switch r.Op {
					case "acq":
						m.holding[r.Worker], m.since[r.Worker], m.until[r.Worker] = r.Slot, r.At, r.Until
					case "rel", "lost":
						delete(m.holding, r.Worker)
					}
					m.mu.Unlock()
				}
			}()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); m.wg.Wait() })
	return m
}

// quiet tells every worker to end its hold or its wait and rest for d,
// keeping its semaphore open (see RunWorker).
func (m *meter) quiet(d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, c := range m.conns {
		_ = c.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = fmt.Fprintf(c, "quiet %s\n", d)
	}
}

// holders returns the workers holding a permit now, by their reports.
func (m *meter) holders() []int {
	m.mu.Lock()
	defer m.mu.Unlock()
	var ws []int
	for w := range m.holding {
		ws = append(ws, w)
	}
	sort.Ints(ws)
	return ws
}

// worker is one worker process.
type worker struct {
	id, pos int
	cmd     *exec.Cmd
	out     strings.Builder
	done    chan struct{}
}

// run is one chaos scenario: workers against one semaphore, and faults.
type run struct {
	t       *testing.T
	p       profile
	label   string // names the scenario in the log
	backend string // "nats" or "amqp": what the workers dial
	name    string
	url     func(pos int) string // the broker URL of the worker at pos
	meter   *meter

	// excuses names the fault kinds that may free a slot behind its
	// holder's back on this broker (nil: all of them). Only those are
	// charged to holds; any other loss must be seen before a takeover.
	excuses map[string]bool
	env     []string // extra environment of every worker

	mu      sync.Mutex
	workers map[int]*worker
	byPos   []int // pos -> id of the current worker there
	nextID  int
	faults  []fault
	kinds   map[string]int
	paused  map[int]int  // pos -> pauses of its link under way
	stalled map[int]bool // workers whose link a pause holds now
	// lives is what a seam scenario did to the semaphore (see Timeline);
	// nil for a semaphore of p.permits that lives for ever.
	lives []Life
}

// runOption adjusts a run before its workers start.
type runOption func(*run)

// excusing limits the faults charged to holds to kinds (see run.excuses).
func excusing(kinds ...string) runOption {
	return func(r *run) {
		r.excuses = map[string]bool{}
		for _, k := range kinds {
			r.excuses[k] = true
		}
	}
}

// withEnv adds to every worker's environment.
func withEnv(kv ...string) runOption { return func(r *run) { r.env = append(r.env, kv...) } }

func newRun(t *testing.T, p profile, label, backend, name string, url func(pos int) string, opts ...runOption) *run {
	r := &run{t: t, p: p, label: label, backend: backend, name: name, url: url, meter: startMeter(t),
		workers: map[int]*worker{}, byPos: make([]int, p.workers), kinds: map[string]int{},
		paused: map[int]int{}, stalled: map[int]bool{}}
	for _, o := range opts {
		o(r)
	}
	for pos := range p.workers {
		r.start(pos)
	}
	t.Cleanup(r.stopAll)
	return r
}

// start starts a worker at pos.
func (r *run) start(pos int) {
	r.mu.Lock()
	id := r.nextID
	r.nextID++
	r.mu.Unlock()
	w := &worker{id: id, pos: pos, done: make(chan struct{})}
	w.cmd = exec.Command(os.Args[0], "-test.run=^$")
	w.cmd.Env = append(os.Environ(), WorkerEnv+"="+strconv.Itoa(id), backendEnv+"="+r.backend,
		urlEnv+"="+r.url(pos), nameEnv+"="+r.name, meterEnv+"="+r.meter.ln.Addr().String())
	w.cmd.Env = append(w.cmd.Env, r.env...)
	w.cmd.Stdout, w.cmd.Stderr = &syncWriter{b: &w.out}, &syncWriter{b: &w.out}
	if err := w.cmd.Start(); err != nil {
		r.t.Errorf("start a worker: %v", err) // not Fatal: injectors run on goroutines of their own
		return
	}
	go func() { _ = w.cmd.Wait(); close(w.done) }()
	r.mu.Lock()
	r.workers[id] = w
	r.byPos[pos] = id
	r.mu.Unlock()
}

type syncWriter struct {
	mu sync.Mutex
	b  *strings.Builder
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// now is the instant faults and reports are stamped with.
func now() int64 { return time.Now().UnixNano() }

// record adds a fault that is over (its end stamped) to the history.
func (r *run) record(f fault) {
	r.mu.Lock()
	r.faults = append(r.faults, f)
	r.kinds[f.kind]++
	r.mu.Unlock()
}

// target picks a worker that holds a permit now (else any live one).
func (r *run) target() *worker {
	r.mu.Lock()
	defer r.mu.Unlock()
	hs := r.meter.holders()
	rand.Shuffle(len(hs), func(i, j int) { hs[i], hs[j] = hs[j], hs[i] })
	for _, id := range hs {
		if w, ok := r.workers[id]; ok && r.byPos[w.pos] == id {
			return w
		}
	}
	return r.workers[r.byPos[rand.IntN(len(r.byPos))]]
}

// kill SIGKILLs a holder and starts a new worker in its place.
func (r *run) kill() {
	w := r.target()
	f := fault{worker: w.id, kind: "kill", begin: now()}
	_ = w.cmd.Process.Kill()
	<-w.done
	f.end = now()
	r.record(f)
	r.start(w.pos)
}

// freeze SIGSTOPs a holder for d from the moment it stopped, then lets it
// go on.
func (r *run) freeze(d time.Duration) {
	w := r.target()
	f := fault{worker: w.id, kind: "freeze", begin: now()}
	_ = w.cmd.Process.Signal(syscall.SIGSTOP)
	if waitStopped(w.cmd.Process.Pid, time.Second) {
		f.stopped = now()
	} else {
		r.t.Logf("freeze: worker %d not seen stopped within 1s; charged over the whole freeze", w.id)
	}
	time.Sleep(d)
	_ = w.cmd.Process.Signal(syscall.SIGCONT)
	f.end = now()
	r.record(f)
}

// waitStopped waits until every thread of process pid is stopped, as
// Linux's /proc shows it (a signal is delivered when its target next runs,
// which on a loaded machine can be a while after kill(2) returned). It
// reports false if that could not be seen within d.
func waitStopped(pid int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if stopped(pid) {
			return true
		}
		time.Sleep(200 * time.Microsecond)
	}
	return false
}

// stopped reports whether every thread of process pid is in state T.
func stopped(pid int) bool {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, p := range tasks {
		b, err := os.ReadFile(p)
		if err != nil {
			return false
		}
		// "tid (comm) S ...": comm may hold anything, even ") ".
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) || b[i+2] != 'T' {
			return false
		}
	}
	return true
}

// stopAll stops every worker (SIGTERM: they release and exit).
func (r *run) stopAll() {
	r.mu.Lock()
	ws := make([]*worker, 0, len(r.workers))
	for _, w := range r.workers {
		ws = append(ws, w)
	}
	r.mu.Unlock()
	for _, w := range ws {
		_ = w.cmd.Process.Signal(syscall.SIGCONT)
		_ = w.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, w := range ws {
		select {
		case <-w.done:
		case <-time.After(30 * time.Second):
			// SIGQUIT makes the Go runtime print every goroutine's stack
			// and exit: the output then shows where the worker hung.
			_ = w.cmd.Process.Signal(syscall.SIGQUIT)
			select {
			case <-w.done:
			case <-time.After(5 * time.Second):
				_ = w.cmd.Process.Kill()
				<-w.done
			}
			r.t.Errorf("worker %d did not stop on SIGTERM (its goroutines at SIGQUIT follow):\n%s", w.id, w.out.String())
		}
	}
}

// inject runs faults for the profile's duration, picking among kinds.
func (r *run) inject(kinds map[string]func()) {
	names := make([]string, 0, len(kinds))
	for k := range kinds {
		names = append(names, k)
	}
	sort.Strings(names)
	end := time.Now().Add(r.p.duration)
	for i := 0; time.Now().Before(end); i++ {
		time.Sleep(r.p.every/2 + rand.N(r.p.every))
		kinds[names[i%len(names)]]()
	}
}

// holds assembles the history from the reports and the faults.
func (r *run) holds() []Hold {
	r.meter.mu.Lock()
	reports := slices.Clone(r.meter.reports)
	r.meter.mu.Unlock()
	r.mu.Lock()
	faults := slices.Clone(r.faults)
	r.mu.Unlock()
	open := map[int]*Hold{}
	var out []Hold
	for _, rep := range reports {
		switch rep.Op {
		case "acq":
			open[rep.Worker] = &Hold{Worker: rep.Worker, Slot: rep.Slot, Fence: rep.Fence, Call: rep.Call, Acquired: rep.At, Deadline: rep.Until}
		case "releasing":
			if h := open[rep.Worker]; h != nil {
				h.Releasing = rep.At
			}
		case "rel", "lost":
			h := open[rep.Worker]
			if h == nil {
				r.t.Errorf("worker %d ended a hold it never reported: %+v", rep.Worker, rep)
				continue
			}
			h.End, h.Ended, h.Lost = rep.At, true, rep.Op == "lost"
			out = append(out, *h)
			delete(open, rep.Worker)
		}
	}
	for _, h := range open {
		out = append(out, *h)
	}
	charge(out, r.excused(faults))
	return out
}

// excused returns the faults that may free a slot behind its holder's back
// on this run's broker.
func (r *run) excused(faults []fault) []fault {
	if r.excuses == nil {
		return faults
	}
	var out []fault
	for _, f := range faults {
		if r.excuses[f.kind] {
			out = append(out, f)
		}
	}
	return out
}

// recoveries returns, for every holder killed while holding, the time from
// its death (at the earliest: the kill's begin, or its Acquired if that was
// later) until the slot's next holder (the next fence) had it. A holder
// whose slot was taken before it died (it was frozen or cut off first) has
// no recovery to measure.
func recoveries(holds []Hold, faults []fault) []time.Duration {
	var out []time.Duration
	for _, f := range faults {
		if f.kind != "kill" {
			continue
		}
		for _, h := range holds {
			if h.Worker != f.worker || h.Ended || h.Releasing != 0 { // a release may have freed it
				continue
			}
			died := max(f.begin, h.Acquired)
			var next *Hold
			for i, o := range holds {
				if o.Slot == h.Slot && o.Fence > h.Fence && (next == nil || o.Fence < next.Fence) {
					next = &holds[i]
				}
			}
			if next != nil && next.Acquired > died {
				out = append(out, time.Duration(next.Acquired-died))
			}
		}
	}
	slices.Sort(out)
	return out
}

func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	return ds[min(len(ds)-1, int(p*float64(len(ds))))]
}

// timeline is what the run did to the semaphore.
func (r *run) timeline() Timeline {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lives == nil {
		return Fixed(r.p.permits)
	}
	lives := slices.Clone(r.lives)
	for i := range lives {
		lives[i].Resizes = slices.Clone(lives[i].Resizes)
	}
	return Timeline{Lives: lives, Converge: resizeConverge}
}

// resizeConverge is how long after a resize clients may admit by the old
// count: "every client admits by the new count within 2 s" (the Resize
// of both backends).
const resizeConverge = 2 * time.Second

// permitsNow is the count of the semaphore now.
func (r *run) permitsNow() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n := len(r.lives); n > 0 {
		return r.lives[n-1].permits()
	}
	return r.p.permits
}

// verdict checks the history and logs the figures of the run. A run with
// lives (a seam scenario) is held to the capacity rule of CheckTimeline,
// not to a fixed N, and has no recovery bound (recoveryBound 0): a slot
// may come back in another life, or not at all after a shrink.
func (r *run) verdict(recoveryBound time.Duration) {
	t := r.t
	holds := r.holds()
	logInversions(t, holds)
	tl := r.timeline()
	seams := tl.Lives[0].Created != math.MinInt64 // not Fixed
	v := CheckTimeline(holds, tl, time.Minute)
	r.mu.Lock()
	faults := slices.Clone(r.faults)
	kinds := fmt.Sprint(r.kinds)
	r.mu.Unlock()
	var rec []time.Duration
	if !seams {
		rec = recoveries(holds, faults) // a slot may come back in another life, or never
	}
	lost := 0
	for _, h := range holds {
		if h.Lost {
			lost++
		}
	}
	t.Logf("%s/%s: %d holds (%d lost), faults %s; max holders %d, max valid holders %d (N=%d), max running holders %d, stale overlaps %d; killed holder's slot back after p50 %v p99 %v max %v (n=%d); porcupine: %s",
		r.label, r.p.name, len(holds), lost, kinds, v.MaxHolders, v.MaxValidHolders, r.p.permits, v.MaxRunning, v.StaleOverlaps,
		pct(rec, .5).Round(time.Millisecond), pct(rec, .99).Round(time.Millisecond), pct(rec, 1).Round(time.Millisecond), len(rec), v.Linearizable)
	if seams {
		logLives(t, tl, holds)
	}
	dump(t, r.label, holds, faults, tl)
	if v.Linearizable != porcupine.Ok {
		t.Errorf("porcupine: the history is %s for a fenced semaphore (per-slot fenced lock, fences growing across lives)", v.Linearizable)
	}
	logViolations(t, v)
	if !seams && v.MaxValidHolders > r.p.permits {
		t.Errorf("%d valid holders at once, N=%d", v.MaxValidHolders, r.p.permits)
	}
	if len(holds) < 20 {
		t.Errorf("only %d holds: the workers hardly ran", len(holds))
	}
	if m := pct(rec, 1); recoveryBound > 0 && m > recoveryBound {
		t.Errorf("a killed holder's slot came back after %v > %v", m, recoveryBound)
	}
	if t.Failed() {
		logEvidence(t, holds, faults, v.Involved)
		r.mu.Lock()
		for _, w := range r.workers {
			if out := w.out.String(); out != "" {
				t.Logf("worker %d output:\n%s", w.id, tail(out, 2000))
			}
		}
		r.mu.Unlock()
	}
}

// dump writes the history of the run as JSON into the directory named by
// TOKENSEM_CHAOS_DUMP, if set, for a closer look at a failure: the holds
// (charged with their faults), the faults and the timeline.
func dump(t *testing.T, label string, holds []Hold, faults []fault, tl Timeline) {
	dir := os.Getenv("TOKENSEM_CHAOS_DUMP")
	if dir == "" {
		return
	}
	type jsonFault struct {
		Worker              int
		Kind                string
		Begin, End, Stopped int64
	}
	fs := make([]jsonFault, len(faults))
	for i, f := range faults {
		fs[i] = jsonFault{f.worker, f.kind, f.begin, f.end, f.stopped}
	}
	b, err := json.Marshal(struct {
		Holds    []Hold
		Faults   []jsonFault
		Timeline Timeline
	}{holds, fs, tl})
	if err == nil {
		p := filepath.Join(dir, fmt.Sprintf("%s-%d.json", label, time.Now().UnixNano()))
		err = os.WriteFile(p, b, 0o644)
		t.Logf("history written to %s", p)
	}
	if err != nil {
		t.Logf("dump: %v", err)
	}
}

// logViolations fails the test with each rule's violations: how many, and
// the first few in full.
func logViolations(t *testing.T, v Verdict) {
	const shown = 5
	seen := map[string]int{}
	for i, s := range v.Violations {
		rule := v.Rules[i]
		if seen[rule]++; seen[rule] <= shown {
			t.Errorf("%s: %s", rule, s)
		}
	}
	for _, rule := range slices.Sorted(maps.Keys(v.Counts)) {
		if n := v.Counts[rule]; n > shown {
			t.Errorf("%s: %d violations in all (%d shown)", rule, n, shown)
		}
	}
}

// logLives logs the lives of a seam run and how many holds each had.
func logLives(t *testing.T, tl Timeline, holds []Hold) {
	if len(holds) == 0 {
		return
	}
	base := slices.MinFunc(holds, func(a, b Hold) int { return cmp.Compare(a.Call, b.Call) }).Call
	s := func(at int64) string {
		if at == 0 || at == math.MaxInt64 || at == math.MinInt64 {
			return "-"
		}
		return strconv.FormatFloat(float64(at-base)/1e9, 'f', 2, 64)
	}
	n := make([]int, len(tl.Lives))
	for _, h := range holds {
		if l := tl.livesOf(h); l.known() {
			n[l.lo]++
		}
	}
	// A NATS permit's deadline is its last write's send time plus 4/5 of
	// the lease it was claimed with: one that reaches past 4/5 of its
	// life's lease (and some slack) was claimed by a handle that trusted
	// a configuration of an earlier life.
	var stale []string
	for _, h := range holds {
		l := tl.livesOf(h)
		if h.Deadline == 0 || !l.known() || tl.Lives[l.lo].Lease == 0 {
			continue
		}
		if over := time.Duration(h.Deadline-h.Acquired) - tl.Lives[l.lo].Lease*4/5; over > 50*time.Millisecond {
			stale = append(stale, fmt.Sprintf("worker %d slot %d fence %d at %s s: deadline %v past the acquire, life %d's lease %v",
				h.Worker, h.Slot, h.Fence, s(h.Acquired), time.Duration(h.Deadline-h.Acquired).Round(time.Millisecond), l.lo+1, tl.Lives[l.lo].Lease))
		}
	}
	if len(stale) > 0 {
		t.Logf("%d permits promised their holders more than their life's lease allows (handles trusting a cached configuration), e.g. %s",
			len(stale), strings.Join(stale[:min(3, len(stale))], "; "))
	}
	for i, l := range tl.Lives {
		var rs []string
		for _, r := range l.Resizes {
			rs = append(rs, fmt.Sprintf("%d->%d at %s..%s", r.From, r.To, s(r.Begin), s(r.End)))
		}
		t.Logf("life %d: N=%d lease %v, created %s..%s, deleted %s..%s, resizes [%s], %d holds of it alone",
			i+1, l.Permits, l.Lease, s(l.Created), s(l.Ready), s(l.Deleting), s(l.Gone), strings.Join(rs, ", "), n[i])
	}
}

// logEvidence logs, for a failed run, the holds of the slots a violation
// is about that began or ended within two seconds of the violating ones,
// and every fault, in milliseconds from the first Acquire call.
func logEvidence(t *testing.T, holds []Hold, faults []fault, involved []Hold) {
	if len(holds) == 0 {
		return
	}
	base := slices.MinFunc(holds, func(a, b Hold) int { return cmp.Compare(a.Call, b.Call) }).Call
	ms := func(at int64) string {
		if at == 0 || at == math.MaxInt64 {
			return "-"
		}
		return strconv.FormatFloat(float64(at-base)/1e6, 'f', 1, 64)
	}
	for _, f := range faults {
		t.Logf("fault %s of worker %d: %s..%s ms (stopped %s)", f.kind, f.worker, ms(f.begin), ms(f.end), ms(f.stopped))
	}
	// The first few holds named, each with the holds of its slot around
	// it; every hold once, in the order of their Acquire's return.
	const (
		first  = 12
		window = int64(time.Second)
	)
	type key struct {
		worker int
		call   int64
	}
	named, shown := map[key]bool{}, map[key]bool{}
	var out []Hold
	for _, in := range involved {
		if len(named) == first {
			break
		}
		named[key{in.Worker, in.Call}] = true
		for _, h := range holds {
			k := key{h.Worker, h.Call}
			if h.Slot == in.Slot && h.Acquired > in.Acquired-window && h.Acquired < in.Acquired+window && !shown[k] {
				shown[k] = true
				out = append(out, h)
			}
		}
	}
	slices.SortFunc(out, func(a, b Hold) int { return cmp.Compare(a.Acquired, b.Acquired) })
	for _, h := range out {
		mark := " "
		if named[key{h.Worker, h.Call}] {
			mark = "*"
		}
		t.Logf("%s slot %d fence %d worker %d: call %s acquired %s releasing %s end %s (ended %v, lost %v) fault %s deadline %s",
			mark, h.Slot, h.Fence, h.Worker, ms(h.Call), ms(h.Acquired), ms(h.Releasing), ms(h.End), h.Ended, h.Lost, ms(h.Fault), ms(h.Deadline))
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// proxies puts a fault proxy in front of target for every worker position.
func proxies(t *testing.T, n int, target string) []*faultproxy.Proxy {
	ps := make([]*faultproxy.Proxy, n)
	for i := range ps {
		p, err := faultproxy.New(target)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		ps[i] = p
	}
	return ps
}

// cut drops a holder's connection.
func (r *run) cut(ps []*faultproxy.Proxy) {
	w := r.target()
	f := fault{worker: w.id, kind: "cut", begin: now()}
	ps[w.pos].Cut()
	f.end = now()
	r.record(f)
}

// delay holds a holder's traffic for d (a "partition" when d outlasts the
// lease).
func (r *run) delay(ps []*faultproxy.Proxy, d time.Duration) { r.hold(ps, "delay", d) }

// partition cuts a holder off from the broker for d without closing its
// connection: its renewals cannot land, while its process runs.
func (r *run) partition(ps []*faultproxy.Proxy, d time.Duration) { r.hold(ps, "partition", d) }

// hold pauses a holder's traffic for d, as a fault of kind.
func (r *run) hold(ps []*faultproxy.Proxy, kind string, d time.Duration) {
	r.holdWorker(ps, r.target(), kind, d)
}

// holdWorker pauses w's traffic for d, as a fault of kind.
func (r *run) holdWorker(ps []*faultproxy.Proxy, w *worker, kind string, d time.Duration) {
	f := fault{worker: w.id, kind: kind, begin: now()}
	r.pause(ps, w)
	time.Sleep(d)
	r.resume(ps, w)
	f.end = now()
	r.record(f)
}

// pause pauses w's link; pauses of one link nest (injectors run at once),
// and the link flows again when the last is resumed.
func (r *run) pause(ps []*faultproxy.Proxy, w *worker) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.paused[w.pos]++; r.paused[w.pos] == 1 {
		ps[w.pos].Pause()
	}
	r.stalled[w.id] = true
}

func (r *run) resume(ps []*faultproxy.Proxy, w *worker) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.paused[w.pos]--; r.paused[w.pos] == 0 {
		ps[w.pos].Resume()
		delete(r.stalled, w.id)
	}
}

// logInversions logs the holds whose report order (by Acquire's return as
// the worker timed it) disagrees with their fences: a worker paused between
// Acquire's return and reading the clock (a freeze, a long stall) reports a
// late Acquired. Check orders by fence and tolerates that; this line is for
// whoever reads a failure.
func logInversions(t *testing.T, holds []Hold) {
	n := 0
	for slot, hs := range bySlot(holds) {
		slices.SortFunc(hs, func(a, b Hold) int { return cmp.Compare(a.Acquired, b.Acquired) })
		for i := 1; i < len(hs); i++ {
			if hs[i].Fence < hs[i-1].Fence {
				if n == 0 {
					t.Logf("slot %d: hold %+v reported after %+v", slot, hs[i], hs[i-1])
				}
				n++
			}
		}
	}
	if n > 0 {
		t.Logf("%d holds reported out of fence order", n)
	}
}

package chaos

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/amqpsem"
	"github.com/tokensem/tokensem/driver"
	"github.com/tokensem/tokensem/internal/faultproxy"
	"github.com/tokensem/tokensem/internal/rabbittest"
	"github.com/tokensem/tokensem/internal/semtest"
	"github.com/tokensem/tokensem/natssem"
	"github.com/tokensem/tokensem/natssem/embedded"
	"github.com/tokensem/tokensem/reconciler"
)

// The seam scenarios: workers hold and wait on one semaphore name, each
// behind its own fault proxy. Most holds are short; one in ten lasts up to
// 3 s, across leases and renewals, and so does the first after a quiet
// rest (below); one rest in twenty lasts up to 1.5 s with the semaphore
// open. Two injectors run at once:
//
//   - on the workers: kill, freeze (past the lease, or the heartbeat
//     timeout), cut, and stall: the link paused for a while, from a tenth
//     of the lease to well past it, then resumed;
//   - on the semaphore, from an admin connection of its own, in turn:
//     Delete after a calm moment, once the workers were told to rest a
//     while with their handles open (twice in a round); Delete while they
//     go on; ForceDelete. A Delete that refuses for a second (a permit is
//     held) is forced. Each is followed by an Init of the name with
//     another count (2 to 5) and, on NATS, another lease (1, 2 or 3 s;
//     after a quiet delete a shorter one if there is one), and a quiet one
//     by the stall of the link of a holder of the new life within 0.2 s of
//     its first acquire (its handle is of the old life; on NATS the holder
//     whose permit reaches furthest). Then resize to another count;
//     reconcile with repair; on NATS a server restart; on RabbitMQ (twice
//     in a round) the loss of a held slot's claim queue (deleted from the
//     admin connection: it stands for the node it lived on), mostly while
//     its holder's link stalls, mostly followed at once by a repair.
//
// Workers whose semaphore is gone open the name again (RunWorker). The
// history is checked against the Timeline the harness recorded (see
// CheckTimeline): porcupine's per-slot fenced lock, with fences growing
// per slot across lives, repairs and resizes; no slot held again, and no
// slot of a new life held, before every earlier holder was told; and no
// more running holders at once than the count in force (max(old, new)
// for 2 s after a resize). Only a kill or a freeze excuses a takeover (on
// RabbitMQ a cut too: the broker learns of a cut connection at the very
// instant the holder does). A stalled holder still runs its timers and
// must learn of its loss first.
//
// Both run in TOKENSEM_CHAOS's profile: short (about 30 s each, in CI),
// long (5 minutes of faults).

// seamAdmin is what the harness does to the semaphore, on one backend.
type seamAdmin interface {
	// create makes a new life of the semaphore (Init).
	create(ctx context.Context, permits int, lease time.Duration) error
	// remove deletes it: Delete, or ForceDelete.
	remove(ctx context.Context, force bool) error
	resize(ctx context.Context, permits int) error
	semaphore() tokensem.Semaphore
	inventory() driver.Inventory
}

// seamRun is a run whose semaphore the harness reshapes.
type seamRun struct {
	*run
	admin  seamAdmin
	leases []time.Duration // the leases a life may get (NATS); nil: none (RabbitMQ)
	ps     []*faultproxy.Proxy

	statsMu               sync.Mutex
	issued, removed, errs int // by the reconciles of the run

	stalls   sync.WaitGroup // stalls started by recreate
	maxStall time.Duration  // the longest stall after a seam

	calmMu   sync.Mutex
	inFlight int   // worker faults under way
	calmFrom int64 // when the last one ended

	// broken is set when an admin call gave up (the test has failed):
	// the timeline no longer says what the broker has, so nothing more is
	// done to the semaphore and the history is not checked.
	broken bool
}

// calm waits, for up to 5 s, until no worker fault is under way or ended
// within d.
func (s *seamRun) calm(d time.Duration) {
	giveUp := time.Now().Add(5 * time.Second)
	for time.Now().Before(giveUp) {
		s.calmMu.Lock()
		ok := s.inFlight == 0 && time.Duration(now()-s.calmFrom) > d
		s.calmMu.Unlock()
		if ok {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// tracked makes each worker fault known to calm.
func (s *seamRun) tracked(faults map[string]func()) map[string]func() {
	out := make(map[string]func(), len(faults))
	for k, f := range faults {
		out[k] = func() { s.busy(f) }
	}
	return out
}

// busy runs the worker fault f, known to calm.
func (s *seamRun) busy(f func()) {
	s.calmMu.Lock()
	s.inFlight++
	s.calmMu.Unlock()
	defer func() {
		s.calmMu.Lock()
		s.inFlight--
		s.calmFrom = now()
		s.calmMu.Unlock()
	}()
	f()
}

const (
	seamMinPermits = 2
	seamMaxPermits = 5
)

// seamWorkerEnv makes the workers' holds and rests as described above.
var seamWorkerEnv = withEnv(longEnv+"=0.1:200ms-3s", idleEnv+"=0.05:100ms-1500ms")

// startSeams makes the first life of the semaphore and starts the workers.
func startSeams(t *testing.T, p profile, label, backend, name string, admin seamAdmin, leases []time.Duration,
	maxStall time.Duration, ps []*faultproxy.Proxy, url func(pos int) string, opts ...runOption) *seamRun {
	var lease time.Duration
	if len(leases) > 0 {
		lease = slices.Max(leases) // so that the first quiet delete can shorten it
	}
	life := Life{Created: now(), Permits: p.permits, Lease: lease}
	if err := admin.create(semtest.Context(t, time.Minute), p.permits, lease); err != nil {
		t.Fatal(err)
	}
	life.Ready = now()
	r := newRun(t, p, label, backend, name, url, append(opts, seamWorkerEnv)...)
	r.mu.Lock()
	r.lives = []Life{life}
	r.mu.Unlock()
	return &seamRun{run: r, admin: admin, leases: leases, ps: ps, maxStall: maxStall}
}

// current is the life the semaphore is in.
func (s *seamRun) current() Life {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lives[len(s.lives)-1]
}

// opCtx bounds one admin call: a ForceDelete on NATS waits a lease, an
// Init waits for a delete cut short.
func (s *seamRun) opCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(s.t.Context(), 30*time.Second)
}

// retry calls op until it succeeds, for up to a minute; false if it never
// did (the test has failed).
func (s *seamRun) retry(what string, op func(ctx context.Context) error) bool {
	giveUp := time.Now().Add(time.Minute)
	for {
		ctx, cancel := s.opCtx()
		err := op(ctx)
		cancel()
		if err == nil {
			return true
		}
		if s.t.Context().Err() != nil || time.Now().After(giveUp) {
			s.t.Errorf("%s: %v (gave up; the history is not checked)", what, err)
			s.broken = true
			return false
		}
		s.t.Logf("%s: %v (trying again)", what, err)
		time.Sleep(100 * time.Millisecond)
	}
}

// otherPermits picks a count other than n.
func otherPermits(n int) int {
	for {
		if m := seamMinPermits + rand.IntN(seamMaxPermits-seamMinPermits+1); m != n {
			return m
		}
	}
}

// How recreate deletes.
const (
	deleteBusy  = iota // Delete while the workers go on
	deleteQuiet        // Delete once the workers were told to rest
	deleteForce        // ForceDelete
)

// recreate deletes the semaphore and makes it again with another count
// and lease. Without force it tries Delete for a second while it refuses
// (a permit is held), then forces. deleteQuiet first waits for a calm
// moment and tells the workers to be quiet for 0.1-0.8 s (they end their
// holds and waits and rest with their semaphores open), as the users of
// an idle semaphore would be: the Delete then mostly succeeds at once, and
// the workers wake in either life, with handles opened in the old one.
func (s *seamRun) recreate(how int) {
	if s.broken {
		return
	}
	cur := s.current()
	force := how == deleteForce
	kind := map[int]string{deleteBusy: "delete", deleteQuiet: "quiet-delete", deleteForce: "force-delete"}[how]
	if how == deleteQuiet {
		// Nobody killed, frozen or cut off lately, whose slot would stay
		// live for a lease (NATS) and make Delete refuse: the deletes
		// that are over at once leave the workers' cached configurations
		// of the old life fresh.
		s.calm(cur.Lease + 300*time.Millisecond)
		s.meter.quiet(100*time.Millisecond + rand.N(700*time.Millisecond))
		time.Sleep(30 * time.Millisecond) // for their releases to land
	}
	begin := now()
	s.mu.Lock()
	s.lives[len(s.lives)-1].Deleting = begin
	s.mu.Unlock()
	insist := time.Now().Add(time.Second)
	tries := 0
	ok := s.retry(kind, func(ctx context.Context) error {
		for {
			tries++
			err := s.admin.remove(ctx, force)
			switch {
			case errors.Is(err, tokensem.ErrHeld) && !force && time.Now().Before(insist):
				time.Sleep(5*time.Millisecond + rand.N(15*time.Millisecond))
				continue
			case errors.Is(err, tokensem.ErrHeld) && !force:
				force, kind = true, kind+"-then-force"
				continue
			case errors.Is(err, tokensem.ErrNotInitialized) && tries > 1:
				return nil // an earlier try that failed had removed it after all
			}
			return err
		}
	})
	if !ok {
		return
	}
	gone := now()
	s.mu.Lock()
	s.lives[len(s.lives)-1].Gone = gone
	s.mu.Unlock()
	s.record(fault{worker: -1, kind: kind, begin: begin, end: gone})

	next := Life{Permits: otherPermits(cur.permits())}
	if len(s.leases) > 0 {
		for next.Lease = cur.Lease; next.Lease == cur.Lease ||
			// After a quiet delete, a shorter lease if there is one: a
			// handle of the old life that trusts its lease then outlives
			// its permit in the new one.
			how == deleteQuiet && next.Lease > cur.Lease && cur.Lease > slices.Min(s.leases); {
			next.Lease = s.leases[rand.IntN(len(s.leases))]
		}
	}
	next.Created = now()
	if !s.retry("init", func(ctx context.Context) error { return s.admin.create(ctx, next.Permits, next.Lease) }) {
		return
	}
	next.Ready = now()
	s.mu.Lock()
	s.lives = append(s.lives, next)
	s.mu.Unlock()
	s.record(fault{worker: -1, kind: "init", begin: next.Created, end: next.Ready})
	if how == deleteQuiet {
		// The workers wake in the new life with handles of the old one
		// (and, for 2 s, its cached configuration): stall the link of one
		// that holds a permit of the new life, soon, for a while.
		s.stalls.Add(1)
		go func() {
			defer s.stalls.Done()
			for giveUp := time.Now().Add(2 * time.Second); time.Now().Before(giveUp); {
				if w, _ := s.holderSince(next.Ready); w != nil {
					time.Sleep(rand.N(200 * time.Millisecond))
					if w, _ = s.holderSince(next.Ready); w != nil {
						s.busy(func() { s.holdWorker(s.ps, w, "stall", s.maxStall/4+rand.N(s.maxStall*3/4)) })
					}
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
		}()
	}
}

// holderSince picks a holder whose hold began after t, or nil: on NATS
// the one whose permit's deadline reaches furthest past its acquire (one
// whose reach is beyond 4/5 of its life's lease was claimed by a handle
// that trusted an earlier life's configuration); on RabbitMQ, whose
// permits report no deadline, the one that has held longest.
func (s *seamRun) holderSince(t int64) (*worker, int) {
	s.meter.mu.Lock()
	var ids []int
	slots, reach := map[int]int{}, map[int]int64{}
	for w, at := range s.meter.since {
		if slot, ok := s.meter.holding[w]; ok && at > t {
			ids, slots[w], reach[w] = append(ids, w), slot, s.meter.until[w]-at
		}
	}
	s.meter.mu.Unlock()
	slices.Sort(ids)
	rand.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
	slices.SortStableFunc(ids, func(a, b int) int { return cmp.Compare(reach[b], reach[a]) })
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		if w, ok := s.workers[id]; ok && s.byPos[w.pos] == id {
			return w, slots[id]
		}
	}
	return nil, 0
}

// resize resizes the semaphore to another count.
func (s *seamRun) resize() {
	if s.broken {
		return
	}
	from := s.current().permits()
	rz := Resize{Begin: now(), From: from, To: otherPermits(from)}
	if !s.retry("resize", func(ctx context.Context) error { return s.admin.resize(ctx, rz.To) }) {
		return
	}
	rz.End = now()
	s.mu.Lock()
	l := &s.lives[len(s.lives)-1]
	l.Resizes = append(l.Resizes, rz)
	s.mu.Unlock()
	kind := "grow"
	if rz.To < rz.From {
		kind = "shrink"
	}
	s.record(fault{worker: -1, kind: kind, begin: rz.Begin, end: rz.End})
}

// reconcile runs a reconcile with repair. A failed one is counted, not a
// failure of the test (a broker restarting, a conflict with a claim).
func (s *seamRun) reconcile() {
	f := fault{worker: -1, kind: "reconcile", begin: now()}
	ctx, cancel := s.opCtx()
	rep, err := reconciler.Run(ctx, s.admin.inventory(), true)
	cancel()
	f.end = now()
	s.record(f)
	s.statsMu.Lock()
	defer s.statsMu.Unlock()
	if err != nil {
		s.errs++
		s.t.Logf("reconcile: %v", err)
		return
	}
	s.issued += rep.Issued
	s.removed += rep.Removed
}

// stall pauses a holder's link for d.
func (s *seamRun) stall(d time.Duration) { s.hold(s.ps, "stall", d) }

// holderOfSlot picks a holder, by the workers' reports: one whose link is
// stalled now if there is one, else one that has held for 50 ms (so in a
// long hold), else any; nil if none holds.
func (s *seamRun) holderOfSlot() (*worker, int) {
	s.meter.mu.Lock()
	holding, since := maps.Clone(s.meter.holding), maps.Clone(s.meter.since)
	s.meter.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	var stalled, long, any []int
	for _, id := range slices.Sorted(maps.Keys(holding)) {
		w, ok := s.workers[id]
		if !ok || s.byPos[w.pos] != id {
			continue
		}
		any = append(any, id)
		if s.stalled[id] {
			stalled = append(stalled, id)
		}
		if time.Duration(now()-since[id]) > 50*time.Millisecond {
			long = append(long, id)
		}
	}
	for _, pick := range [][]int{stalled, long, any} {
		if len(pick) > 0 {
			id := pick[rand.IntN(len(pick))]
			return s.workers[id], holding[id]
		}
	}
	return nil, 0
}

// loseClaim deletes the claim queue of a held slot (lose), standing for
// the loss of the node it lived on: preferably the slot of a holder whose
// link stalls now; else, in two cases of three, the harness stalls the
// holder's link itself for 0.5-3 s around the loss. In two cases of three
// a repair follows at once, as an operator's or a watchdog's would.
func (s *seamRun) loseClaim(lose func(ctx context.Context, slot int) error) {
	w, slot := s.holderOfSlot()
	if w == nil {
		return
	}
	s.mu.Lock()
	already := s.stalled[w.id]
	s.mu.Unlock()
	var st fault
	var until time.Time
	if !already && rand.IntN(3) > 0 {
		st = fault{worker: w.id, kind: "stall", begin: now()}
		until = time.Now().Add(500*time.Millisecond + rand.N(2500*time.Millisecond))
		s.pause(s.ps, w)
	}
	f := fault{worker: w.id, kind: "claim-loss", begin: now()}
	ctx, cancel := s.opCtx()
	err := lose(ctx, slot)
	cancel()
	f.end = now()
	if err != nil {
		s.t.Logf("claim-loss of slot %d: %v", slot, err)
	} else {
		s.record(f)
	}
	if rand.IntN(3) > 0 {
		s.reconcile()
	}
	if st.begin != 0 {
		time.Sleep(time.Until(until))
		s.resume(s.ps, w)
		st.end = now()
		s.record(st)
	}
}

// runSeams injects the faults on the workers and on the semaphore at once
// for the profile's duration, then settles and checks the run.
func (s *seamRun) runSeams(workerFaults, semFaults map[string]func()) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.inject(s.tracked(workerFaults))
	}()
	s.inject(semFaults)
	wg.Wait()
	s.stalls.Wait()
	if s.broken {
		return
	}
	settle(s.t, s.run, s.admin.semaphore(), s.admin.inventory())
	s.statsMu.Lock()
	s.t.Logf("%s: the reconciles of the run issued %d tokens, removed %d, failed %d times", s.label, s.issued, s.removed, s.errs)
	s.statsMu.Unlock()
	s.verdict(0)
}

// seamProfile is the profile of a seam scenario: the short one injects
// for 25 s (the whole test takes about 30 s), the long one as the others.
func seamProfile(t *testing.T) profile {
	p := chosenProfile(t)
	if p.name == "short" {
		p.duration = 25 * time.Second
	}
	return p
}

// TestChaosSeamsNATS: the seam scenario on one NATS server.
func TestChaosSeamsNATS(t *testing.T) {
	p := seamProfile(t)
	store := t.TempDir()
	srv, err := embedded.Start(embedded.Config{StoreDir: store})
	if err != nil {
		t.Fatal(err)
	}
	addr := srv.Addr().String()
	defer func() {
		if srv != nil {
			srv.Shutdown()
		}
	}()
	nc, err := nats.Connect(srv.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	name := "chaos-seams"
	admin := &natsAdmin{nc: nc, name: name}
	defer admin.close()

	ps := proxies(t, p.workers, addr)
	s := startSeams(t, p, "nats-seams", "nats", name, admin,
		[]time.Duration{time.Second, 2 * time.Second, 3 * time.Second}, 4*time.Second,
		ps, func(pos int) string { return "nats://" + ps[pos].Addr() }, natsRules()...)
	lease := func() time.Duration { return s.current().Lease }
	s.runSeams(map[string]func(){
		"kill":   s.kill,
		"freeze": func() { s.freeze(lease() + lease()/2) },
		"cut":    func() { s.cut(ps) },
		"stall":  func() { s.stall(lease()/10 + rand.N(lease()*3/2)) },
	}, map[string]func(){
		"delete":       func() { s.recreate(deleteQuiet) },
		"delete-again": func() { s.recreate(deleteQuiet) },
		"delete-busy":  func() { s.recreate(deleteBusy) },
		"force":        func() { s.recreate(deleteForce) },
		"resize":       s.resize,
		"reconcile":    s.reconcile,
		"restart": func() {
			if s.broken {
				return
			}
			f := fault{worker: -1, kind: "restart", begin: now()}
			srv.Shutdown()
			time.Sleep(100 * time.Millisecond)
			if srv, err = embedded.Start(embedded.Config{Listen: addr, StoreDir: store}); err != nil {
				t.Errorf("restart on the same store: %v", err)
				s.broken = true
				return
			}
			f.end = now()
			s.record(f)
		},
	})
}

// natsAdmin reshapes a NATS semaphore through a connection of its own.
type natsAdmin struct {
	nc   *nats.Conn
	name string
	s    *natssem.Semaphore
}

func (a *natsAdmin) create(ctx context.Context, permits int, lease time.Duration) error {
	s, err := natssem.Init(ctx, a.nc, a.name, permits, natssem.WithLease(lease))
	if err != nil {
		return err
	}
	a.close()
	a.s = s
	return nil
}

func (a *natsAdmin) remove(ctx context.Context, force bool) error {
	if force {
		return natssem.ForceDelete(ctx, a.nc, a.name)
	}
	return natssem.Delete(ctx, a.nc, a.name)
}

func (a *natsAdmin) resize(ctx context.Context, permits int) error {
	_, err := a.s.Resize(ctx, permits)
	return err
}

func (a *natsAdmin) semaphore() tokensem.Semaphore { return a.s }
func (a *natsAdmin) inventory() driver.Inventory   { return a.s.Inventory() }

func (a *natsAdmin) close() {
	if a.s != nil {
		_ = a.s.Close()
	}
}

// TestChaosSeamsRabbit: the seam scenario on RabbitMQ.
func TestChaosSeamsRabbit(t *testing.T) {
	t.Parallel() // RabbitMQ's chaos runs side by side, after the NATS ones
	p := seamProfile(t)
	b := rabbittest.Need(t)
	c, err := amqpsem.Dial(semtest.Context(t, time.Minute), b.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	name := "chaos-seams-" + driver.NewToken("x", 0, 0).ID[:8]
	admin := &amqpAdmin{url: b.URL, c: c, name: name}
	defer admin.close()
	// Quorum queues left behind slow the broker down for everyone.
	defer func() { _ = amqpsem.ForceDelete(semtest.Context(t, time.Minute), c, name) }()

	ps := proxies(t, p.workers, b.Addr)
	s := startSeams(t, p, "amqp-seams", "amqp", name, admin, nil, 4*time.Second,
		ps, func(pos int) string { return b.URLVia(ps[pos].Addr()) }, excusing("kill", "freeze", "cut"))
	s.runSeams(map[string]func(){
		"kill":   s.kill,
		"freeze": func() { s.freeze(4 * time.Second) }, // RabbitMQ drops a client ~3 heartbeats (1 s) after it went silent
		"cut":    func() { s.cut(ps) },
		"stall":  func() { s.stall(300*time.Millisecond + rand.N(3700*time.Millisecond)) },
	}, map[string]func(){
		"delete":           func() { s.recreate(deleteQuiet) },
		"delete-again":     func() { s.recreate(deleteQuiet) },
		"delete-busy":      func() { s.recreate(deleteBusy) },
		"force":            func() { s.recreate(deleteForce) },
		"resize":           s.resize,
		"reconcile":        s.reconcile,
		"claim-loss":       func() { s.loseClaim(admin.loseClaim) },
		"claim-loss-again": func() { s.loseClaim(admin.loseClaim) },
	})
}

// amqpAdmin reshapes a RabbitMQ semaphore through a connection of its own,
// and loses claim queues through a plain AMQP connection.
type amqpAdmin struct {
	url  string
	c    *amqpsem.Conn
	name string
	s    *amqpsem.Semaphore
	raw  *amqp.Connection
}

func (a *amqpAdmin) create(ctx context.Context, permits int, _ time.Duration) error {
	s, err := amqpsem.Init(ctx, a.c, a.name, permits)
	if err != nil {
		return err
	}
	if a.s != nil {
		_ = a.s.Close()
	}
	a.s = s
	return nil
}

func (a *amqpAdmin) remove(ctx context.Context, force bool) error {
	if force {
		return amqpsem.ForceDelete(ctx, a.c, a.name)
	}
	return amqpsem.Delete(ctx, a.c, a.name)
}

func (a *amqpAdmin) resize(ctx context.Context, permits int) error {
	_, err := a.s.Resize(ctx, permits)
	return err
}

func (a *amqpAdmin) semaphore() tokensem.Semaphore { return a.s }
func (a *amqpAdmin) inventory() driver.Inventory   { return a.s.Inventory() }

// loseClaim deletes the claim queue of slot (tokensem.NAME.claim.I): the
// broker cancels its holder's claim consumer.
func (a *amqpAdmin) loseClaim(_ context.Context, slot int) error {
	if a.raw == nil || a.raw.IsClosed() {
		raw, err := amqp.Dial(a.url)
		if err != nil {
			return err
		}
		a.raw = raw
	}
	ch, err := a.raw.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	q := amqpsem.ResourcesOf(a.name).Queue + ".claim." + strconv.Itoa(slot)
	if _, err := ch.QueueDelete(q, false, false, false); err != nil {
		return fmt.Errorf("delete %s: %w", q, err)
	}
	return nil
}

func (a *amqpAdmin) close() {
	if a.s != nil {
		_ = a.s.Close()
	}
	if a.raw != nil {
		_ = a.raw.Close()
	}
}

package reconciler_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/amqpsem"
	"github.com/tokensem/tokensem/driver"
	"github.com/tokensem/tokensem/internal/semtest"
	"github.com/tokensem/tokensem/internal/testenv"
	"github.com/tokensem/tokensem/natssem"
	"github.com/tokensem/tokensem/natssem/embedded"
	"github.com/tokensem/tokensem/reconciler"
)

var (
	srv     *embedded.Server
	brokers testenv.Brokers
)

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, testenv.NATS|testenv.Rabbit, func(b testenv.Brokers) { srv, brokers = b.NATS, b }))
}

// fixture is one semaphore on one broker, with ways to damage it straight
// on the broker.
type fixture struct {
	name        string
	sem         tokensem.Semaphore
	inventory   func() driver.Inventory
	publish     func(t testing.TB, b []byte)
	deleteToken func(t testing.TB, index int)
	resize      func(ctx context.Context, permits int) (reconciler.Report, error)
}

// backends are the brokers the reconciler tests run on.
var backends = []struct {
	name string
	new  func(t testing.TB, name string, permits int, key []byte) *fixture
}{
	{"nats", newNATS},
	{"amqp", newAMQP},
}

// fixtureName makes name unique to one fixture, so that a test run again
// in the same process (-count) meets no semaphore of an earlier run.
func fixtureName(name string) string {
	return name + "-" + strconv.FormatInt(fixtures.Add(1), 10)
}

var fixtures atomic.Int64

func newNATS(t testing.TB, name string, permits int, key []byte) *fixture {
	t.Helper()
	name = fixtureName(name)
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	var opts []natssem.Option
	if key != nil {
		opts = append(opts, natssem.WithKey(key))
	}
	s, err := natssem.Init(bounded(t), nc, name, permits, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{
		name: name, sem: s, resize: s.Resize,
		inventory: func() driver.Inventory { return s.Inventory() },
		publish: func(t testing.TB, b []byte) {
			t.Helper()
			if _, err := js.Publish(bounded(t), natssem.ResourcesOf(name, "").Subject, b); err != nil {
				t.Fatal(err)
			}
		},
		deleteToken: func(t testing.TB, index int) {
			t.Helper()
			c, err := s.Inventory().Census(bounded(t))
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range c.Entries {
				if e.Valid && e.Token.Index == index {
					seq, _ := strconv.ParseUint(e.Ref, 10, 64)
					stream, err := js.Stream(bounded(t), natssem.ResourcesOf(name, "").Stream)
					if err != nil {
						t.Fatal(err)
					}
					if err := stream.DeleteMsg(bounded(t), seq); err != nil {
						t.Fatal(err)
					}
					return
				}
			}
			t.Fatalf("no token of slot %d", index)
		},
	}
}

func newAMQP(t testing.TB, name string, permits int, key []byte) *fixture {
	t.Helper()
	rabbit := brokers.RabbitFor(t)
	name = fixtureName(name) + "-" + semtest.RunID
	c, err := amqpsem.Dial(bounded(t), rabbit.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	var opts []amqpsem.Option
	if key != nil {
		opts = append(opts, amqpsem.WithKey(key))
	}
	s, err := amqpsem.Init(bounded(t), c, name, permits, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	raw, err := amqp.Dial(rabbit.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = raw.Close() })
	return &fixture{
		name: name, sem: s, resize: s.Resize,
		inventory: func() driver.Inventory { return s.Inventory() },
		publish: func(t testing.TB, b []byte) {
			t.Helper()
			ch, err := raw.Channel()
			if err != nil {
				t.Fatal(err)
			}
			defer ch.Close()
			if err := ch.Confirm(false); err != nil {
				t.Fatal(err)
			}
			dc, err := ch.PublishWithDeferredConfirmWithContext(bounded(t), "", amqpsem.ResourcesOf(name).Queue, true, false,
				amqp.Publishing{DeliveryMode: amqp.Persistent, Body: b})
			if err != nil {
				t.Fatal(err)
			}
			if ok, err := dc.WaitContext(bounded(t)); !ok || err != nil {
				t.Fatalf("publish: %v %v", ok, err)
			}
		},
		deleteToken: func(t testing.TB, index int) {
			t.Helper()
			ch, err := raw.Channel()
			if err != nil {
				t.Fatal(err)
			}
			defer ch.Close() // requeues the others
			for {
				d, ok, err := ch.Get(amqpsem.ResourcesOf(name).Queue, false)
				if err != nil || !ok {
					t.Fatalf("no ready token of slot %d (%v)", index, err)
				}
				if tok, err := driver.NewCodec(key).Decode(d.Body); err == nil && tok.Index == index {
					if err := d.Ack(false); err != nil {
						t.Fatal(err)
					}
					return
				}
			}
		},
	}
}

// bounded returns a context that ends with the test or after testTimeout,
// so a broker that stops answering fails the test at the call that waited
// instead of hanging the package until go test's own timeout.
func bounded(t testing.TB) context.Context { return semtest.Context(t, testTimeout) }

const testTimeout = 45 * time.Second

// epoch returns the epoch of the fixture's semaphore (its life, which its
// tokens carry).
func (f *fixture) epoch(t testing.TB) uint64 {
	t.Helper()
	st, err := f.sem.Status(bounded(t))
	if err != nil {
		t.Fatal(err)
	}
	return st.Epoch
}

// usable takes every permit that can be had right now, returns them all, and
// reports how many there were: the admission bound as clients see it.
func (f *fixture) usable(t testing.TB) int {
	t.Helper()
	var ps []tokensem.Permit
	for {
		p, err := f.sem.TryAcquire(bounded(t))
		if errors.Is(err, tokensem.ErrNoPermit) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	for _, p := range ps {
		if err := p.Release(bounded(t)); err != nil {
			t.Fatal(err)
		}
	}
	return len(ps)
}

func run(t testing.TB, f *fixture, repair bool) reconciler.Report {
	t.Helper()
	r, err := reconciler.Run(bounded(t), f.inventory(), repair)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestRepair(t *testing.T) {
	key := []byte("reconciler-test-key-0123456789")
	tests := []struct {
		name   string
		key    []byte
		inject func(t *testing.T, f *fixture)
		check  func(t *testing.T, r reconciler.Report)
	}{
		{"copied token", nil, func(t *testing.T, f *fixture) {
			b, _ := driver.Codec{}.Encode(driver.NewToken(f.name, 1, f.epoch(t)))
			f.publish(t, b)
		}, func(t *testing.T, r reconciler.Report) {
			if len(r.Duplicates) != 1 || r.Duplicates[0] != 1 {
				t.Errorf("duplicates = %v, want [1]", r.Duplicates)
			}
		}},
		{"deleted token", nil, func(t *testing.T, f *fixture) { f.deleteToken(t, 2) },
			func(t *testing.T, r reconciler.Report) {
				if len(r.Missing) != 1 || r.Missing[0] != 2 {
					t.Errorf("missing = %v, want [2]", r.Missing)
				}
			}},
		{"junk", nil, func(t *testing.T, f *fixture) { f.publish(t, []byte("junk")) },
			func(t *testing.T, r reconciler.Report) {
				if r.Invalid != 1 {
					t.Errorf("invalid = %d, want 1", r.Invalid)
				}
			}},
		{"forged", key, func(t *testing.T, f *fixture) {
			b, _ := driver.NewCodec([]byte("attacker-key-0123456789")).Encode(driver.NewToken(f.name, 0, f.epoch(t)))
			f.publish(t, b)
		}, func(t *testing.T, r reconciler.Report) {
			if r.Invalid != 1 || len(r.Duplicates) != 0 {
				t.Errorf("invalid = %d, duplicates %v; want the forgery invalid, not a duplicate", r.Invalid, r.Duplicates)
			}
		}},
		{"retired", nil, func(t *testing.T, f *fixture) {
			for _, tok := range []tokensem.Token{driver.NewToken(f.name, 7, f.epoch(t)), driver.NewToken(f.name, 0, 0)} {
				b, _ := driver.Codec{}.Encode(tok)
				f.publish(t, b)
			}
		}, func(t *testing.T, r reconciler.Report) {
			if r.Invalid != 2 {
				t.Errorf("invalid = %d, want 2 (index >= N, old epoch)", r.Invalid)
			}
		}},
	}
	for _, be := range backends {
		for i, tc := range tests {
			t.Run(be.name+"/"+tc.name, func(t *testing.T) {
				f := be.new(t, fmt.Sprintf("repair-%d", i), 3, tc.key)
				tc.inject(t, f)
				report := run(t, f, false)
				if report.Healthy {
					t.Fatalf("report-only run called the damaged semaphore healthy: %+v", report)
				}
				tc.check(t, report)
				if st, err := f.sem.Status(bounded(t)); err != nil || st.Healthy {
					t.Fatalf("status did not report the damage: %+v %v", st, err)
				}
				if again := run(t, f, false); again.Healthy {
					t.Fatal("a report-only run repaired something")
				}
				if n := f.usable(t); n > 3 {
					t.Fatalf("%d permits usable before the repair, of 3", n)
				}
				fixed := run(t, f, true)
				if !fixed.Healthy {
					t.Fatalf("after repair: %+v", fixed)
				}
				st, err := f.sem.Status(bounded(t))
				if err != nil {
					t.Fatal(err)
				}
				if st.Tokens != 3 || !st.Healthy {
					t.Fatalf("status after repair: %+v", st)
				}
				if n := f.usable(t); n != 3 {
					t.Fatalf("%d permits usable after the repair, want exactly 3", n)
				}
			})
		}
	}
}

// TestHeldDuplicate: the copy of a held slot is removed and the holder
// keeps its permit.
func TestHeldDuplicate(t *testing.T) {
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			f := be.new(t, "held-dup", 1, nil)
			p, err := f.sem.Acquire(bounded(t))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := driver.Codec{}.Encode(driver.NewToken(f.name, 0, f.epoch(t)))
			f.publish(t, b)
			r := run(t, f, true)
			if r.Removed != 1 || !r.Healthy {
				t.Fatalf("repair of a held slot's copy: %+v", r)
			}
			if p.Err() != nil {
				t.Fatalf("holder lost its permit to the repair: %v", p.Err())
			}
			if _, err := f.sem.TryAcquire(bounded(t)); !errors.Is(err, tokensem.ErrNoPermit) {
				t.Fatalf("second permit of N=1 after the repair: %v", err)
			}
			if err := p.Release(bounded(t)); err != nil {
				t.Fatal(err)
			}
			if n := f.usable(t); n != 1 {
				t.Fatalf("%d usable, want 1", n)
			}
		})
	}
}

// TestMissingWhileHeld: a held slot whose message vanished is not proven
// absent; it is issued only after its holder is gone. The run reports the
// held slot without a token as a problem.
func TestMissingWhileHeld(t *testing.T) {
	// NATS only: on RabbitMQ a held token is an unacked delivery that no
	// one but its holder can delete.
	for _, be := range backends[:1] {
		t.Run(be.name, func(t *testing.T) {
			f := be.new(t, "missing-held", 1, nil)
			p, err := f.sem.Acquire(bounded(t))
			if err != nil {
				t.Fatal(err)
			}
			f.deleteToken(t, 0)
			if r := run(t, f, true); r.Issued != 0 || r.Healthy || len(r.Problems) != 1 {
				t.Fatalf("issued a token for a slot with a live holder, or said nothing of it: %+v", r)
			}
			if err := p.Release(bounded(t)); err != nil {
				t.Fatal(err)
			}
			r := run(t, f, true)
			if r.Issued != 1 || !r.Healthy {
				t.Fatalf("after the holder released: %+v", r)
			}
			if n := f.usable(t); n != 1 {
				t.Fatalf("%d usable, want 1", n)
			}
		})
	}
}

// TestConcurrentReconcilers: two reconcilers repairing the same losses at
// once issue each missing slot exactly once.
func TestConcurrentReconcilers(t *testing.T) {
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			for round := range 5 {
				f := be.new(t, fmt.Sprintf("concurrent-%d", round), 4, nil)
				f.deleteToken(t, 1)
				f.deleteToken(t, 3)
				var wg sync.WaitGroup
				reports := make([]reconciler.Report, 2)
				for i := range reports {
					wg.Go(func() {
						r, err := reconciler.Run(bounded(t), f.inventory(), true)
						if err != nil {
							t.Error(err)
						}
						reports[i] = r
					})
				}
				wg.Wait()
				if issued := reports[0].Issued + reports[1].Issued; issued != 2 {
					t.Fatalf("round %d: %d tokens issued for 2 losses (%+v)", round, issued, reports)
				}
				st, err := f.sem.Status(bounded(t))
				if err != nil {
					t.Fatal(err)
				}
				if st.Tokens != 4 || !st.Healthy {
					t.Fatalf("round %d: %+v", round, st)
				}
			}
		})
	}
}

// BenchmarkCensus10k and BenchmarkRepair10k measure N = 10,000.
func BenchmarkCensus10k(b *testing.B) {
	f := newNATS(b, "census-10k", 10_000, nil)
	inv := f.inventory()
	for b.Loop() {
		if _, err := inv.Census(bounded(b)); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRepair10k(b *testing.B) {
	f := newNATS(b, "repair-10k", 10_000, nil)
	epoch := f.epoch(b)
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		for j := range 100 { // 100 losses and 100 copies
			f.deleteToken(b, (i*100+j)%10_000)
			tok, _ := driver.Codec{}.Encode(driver.NewToken(f.name, (i*100+j+5000)%10_000, epoch))
			f.publish(b, tok)
		}
		b.StartTimer()
		r, err := reconciler.Run(bounded(b), f.inventory(), true)
		if err != nil || !r.Healthy || r.Issued != 100 || r.Removed != 100 {
			b.Fatalf("repair: %+v %v", r, err)
		}
		b.ReportMetric(float64(r.Census.Milliseconds()), "census-ms")
		b.ReportMetric(float64(r.Repair.Milliseconds()), "repair-ms")
	}
}

// TestResize grows a semaphore, then shrinks it while permits are held:
// holders keep their permits, admission never exceeds max(old, new), and
// once they release exactly the new number of permits remains.
func TestResize(t *testing.T) {
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			ctx := bounded(t)
			f := be.new(t, "resize", 3, nil)
			r, err := f.resize(ctx, 5)
			if err != nil || !r.Healthy || r.Issued != 2 {
				t.Fatalf("grow 3 -> 5: %+v %v", r, err)
			}
			if n := f.usable(t); n != 5 {
				t.Fatalf("%d usable after growing to 5", n)
			}
			var held []tokensem.Permit
			for range 4 {
				p, err := f.sem.Acquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				held = append(held, p)
			}
			r, err = f.resize(ctx, 2)
			if err != nil || !r.Healthy {
				t.Fatalf("shrink 5 -> 2 with 4 held: %+v %v", r, err)
			}
			for _, p := range held {
				if p.Err() != nil {
					t.Fatalf("a holder lost its permit to the shrink: %v", p.Err())
				}
			}
			extra := f.usable(t) // at most the one unheld old slot
			if len(held)+extra > 5 {
				t.Fatalf("%d held + %d more during the shrink > max(5, 2)", len(held), extra)
			}
			for _, p := range held {
				if err := p.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if n := f.usable(t); n != 2 {
				t.Fatalf("%d usable after the shrink settled, want 2", n)
			}
			if r := run(t, f, true); !r.Healthy || r.Permits != 2 {
				t.Fatalf("after the shrink: %+v", r)
			}
			st, err := f.sem.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if st.Tokens != 2 || st.Permits != 2 || !st.Healthy {
				t.Fatalf("status after the shrink: %+v", st)
			}
		})
	}
}

// TestShrinkAndGrowBackWhileHeld: a shrink leaves the retired token of a
// slot still held where it is (its holder keeps the permit), so growing
// back before the holder releases loses nothing: after the release every
// permit is usable again, with no reconcile in between.
func TestShrinkAndGrowBackWhileHeld(t *testing.T) {
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			ctx := bounded(t)
			f := be.new(t, "regrow", 4, nil)
			var held []tokensem.Permit
			for range 4 {
				p, err := f.sem.Acquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				held = append(held, p)
			}
			if r, err := f.resize(ctx, 3); err != nil || !r.Healthy || r.Removed != 0 {
				t.Fatalf("shrink 4 -> 3 with every permit held: %+v %v (want healthy, nothing removed)", r, err)
			}
			if r, err := f.resize(ctx, 4); err != nil || !r.Healthy || r.Issued != 0 {
				t.Fatalf("grow back to 4 while slot 3 is still held: %+v %v (want healthy, nothing issued)", r, err)
			}
			for _, p := range held {
				if p.Err() != nil {
					t.Fatalf("a holder lost its permit to the resizes: %v", p.Err())
				}
				if err := p.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if n := f.usable(t); n != 4 {
				t.Fatalf("%d usable after shrinking and growing back, want 4", n)
			}
		})
	}
}

// BenchmarkCensus10kAMQP measures a repair of 100 losses at N = 10,000
// on RabbitMQ: a census (every ready token streamed to the census channel
// and kept unacked, the claim queues of the slots without one looked up),
// the repair, and the census after it.
func BenchmarkCensus10kAMQP(b *testing.B) {
	f := newAMQP(b, "census-10k", 10_000, nil)
	raw, err := amqp.Dial(brokers.RabbitFor(b).URL)
	if err != nil {
		b.Fatal(err)
	}
	defer raw.Close()
	for b.Loop() {
		b.StopTimer()
		ch, err := raw.Channel()
		if err != nil {
			b.Fatal(err)
		}
		for range 100 { // lose 100 tokens
			d, ok, err := ch.Get(amqpsem.ResourcesOf(f.name).Queue, false)
			if err != nil || !ok {
				b.Fatal(ok, err)
			}
			if err := d.Ack(false); err != nil {
				b.Fatal(err)
			}
		}
		_ = ch.Close()
		b.StartTimer()
		r, err := reconciler.Run(bounded(b), f.inventory(), true)
		if err != nil || !r.Healthy || r.Issued != 100 {
			b.Fatalf("repair: %+v %v", r, err)
		}
		b.ReportMetric(float64(r.Census.Milliseconds()), "census-ms")
		b.ReportMetric(float64(r.Repair.Milliseconds()), "repair-ms")
	}
}

// TestWatch: the long-running loop repairs damage that appears while it
// runs, and stops with its context.
func TestWatch(t *testing.T) {
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			f := be.new(t, "watch", 2, nil)
			ctx, cancel := context.WithCancel(bounded(t))
			reports := make(chan reconciler.Report, 100)
			done := make(chan error, 1)
			go func() {
				done <- reconciler.Watch(ctx, f.inventory(), 50*time.Millisecond, true, func(r reconciler.Report, err error) {
					if err == nil {
						select {
						case reports <- r:
						default:
						}
					}
				})
			}()
			<-reports
			f.publish(t, []byte("junk that appears later"))
			deadline := time.After(10 * time.Second)
			for repaired := false; !repaired; {
				select {
				case r := <-reports:
					repaired = r.Removed == 1 && r.Healthy
				case <-deadline:
					t.Fatal("the watch never removed the junk")
				}
			}
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Fatalf("Watch returned %v, want context.Canceled", err)
			}
		})
	}
}

// TestRepairLarge repairs a semaphore large enough for the census paths
// of big semaphores (RabbitMQ streams the ready tokens and looks up only
// the claims of slots without one), with permits held meanwhile.
func TestRepairLarge(t *testing.T) {
	const n = 200
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			f := be.new(t, "repair-large", n, nil)
			var held []tokensem.Permit
			for range 3 {
				p, err := f.sem.Acquire(bounded(t))
				if err != nil {
					t.Fatal(err)
				}
				held = append(held, p)
			}
			f.deleteToken(t, 150)
			copied := 0 // a ready slot
			for busy := true; busy; {
				copied++
				busy = copied == 150
				for _, p := range held {
					busy = busy || p.Token().Index == copied
				}
			}
			b, _ := driver.Codec{}.Encode(driver.NewToken(f.name, copied, f.epoch(t)))
			f.publish(t, b)
			f.publish(t, []byte("junk"))

			before := run(t, f, false)
			if before.Healthy || len(before.Missing) != 1 || before.Missing[0] != 150 ||
				len(before.Duplicates) != 1 || before.Duplicates[0] != copied || before.Invalid != 1 {
				t.Fatalf("census of the damage: %+v", before)
			}
			r := run(t, f, true)
			if !r.Healthy || r.Issued != 1 || r.Removed != 2 {
				t.Fatalf("repair: %+v", r)
			}
			for _, p := range held {
				if p.Err() != nil {
					t.Fatalf("a holder lost its permit to the repair: %v", p.Err())
				}
			}
			if got := f.usable(t); got != n-len(held) {
				t.Fatalf("%d usable beside %d held, want %d", got, len(held), n-len(held))
			}
			for _, p := range held {
				if err := p.Release(bounded(t)); err != nil {
					t.Fatal(err)
				}
			}
			if got := f.usable(t); got != n {
				t.Fatalf("%d usable after the holders released, want %d", got, n)
			}
		})
	}
}

// TestFenceAcrossReissue: a slot's fencing number keeps growing when its
// token is lost and the reconciler issues a new one.
func TestFenceAcrossReissue(t *testing.T) {
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			f := be.new(t, "fence-reissue", 1, nil)
			var last uint64
			cycle := func() {
				t.Helper()
				p, err := f.sem.Acquire(bounded(t))
				if err != nil {
					t.Fatal(err)
				}
				if p.Fence() <= last {
					t.Fatalf("fence %d after %d", p.Fence(), last)
				}
				last = p.Fence()
				if err := p.Release(bounded(t)); err != nil {
					t.Fatal(err)
				}
			}
			for range 5 {
				cycle()
			}
			f.deleteToken(t, 0)
			if r := run(t, f, true); r.Issued != 1 || !r.Healthy {
				t.Fatalf("reissue: %+v", r)
			}
			for range 3 {
				cycle()
			}
		})
	}
}

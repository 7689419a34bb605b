package reconciler_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/natssem"
	"github.com/tokensem/tokensem/natssem/embedded"
	"github.com/tokensem/tokensem/reconciler"
)

var srv *embedded.Server

func TestMain(m *testing.M) {
	var err error
	if srv, err = embedded.Start(embedded.Config{}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	srv.Shutdown()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "leaked goroutines:", err)
			code = 1
		}
	}
	os.Exit(code)
}

type natsFixture struct {
	name string
	sem  *natssem.Semaphore
	js   jetstream.JetStream
	key  []byte
}

func newNATS(t testing.TB, name string, permits int, key []byte) *natsFixture {
	t.Helper()
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	var opts []natssem.Option
	if key != nil {
		opts = append(opts, natssem.WithKey(key))
	}
	s, err := natssem.Init(context.Background(), nc, name, permits, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return &natsFixture{name: name, sem: s, js: js, key: key}
}

// publish puts raw bytes on the token subject, as an operator could.
func (f *natsFixture) publish(t testing.TB, b []byte) {
	t.Helper()
	if _, err := f.js.Publish(context.Background(), natssem.Subject(f.name), b); err != nil {
		t.Fatal(err)
	}
}

// deleteToken deletes the message of one slot straight on the stream.
func (f *natsFixture) deleteToken(t testing.TB, index int) {
	t.Helper()
	c, err := f.sem.Inventory().Census(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range c.Entries {
		if e.Valid && e.Token.Index == index {
			seq, _ := strconv.ParseUint(e.Ref, 10, 64)
			stream, err := f.js.Stream(context.Background(), natssem.StreamName(f.name))
			if err != nil {
				t.Fatal(err)
			}
			if err := stream.DeleteMsg(context.Background(), seq); err != nil {
				t.Fatal(err)
			}
			return
		}
	}
	t.Fatalf("no token of slot %d", index)
}

// usable takes every permit that can be had right now, returns them all, and
// reports how many there were: the admission bound as clients see it.
func (f *natsFixture) usable(t testing.TB) int {
	t.Helper()
	var ps []tokensem.Permit
	for {
		p, err := f.sem.TryAcquire(context.Background())
		if errors.Is(err, tokensem.ErrNoPermit) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	for _, p := range ps {
		if err := p.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	return len(ps)
}

func run(t testing.TB, f *natsFixture, repair bool) reconciler.Report {
	t.Helper()
	r, err := reconciler.Run(context.Background(), f.sem.Inventory(), repair)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestRepairNATS(t *testing.T) {
	key := []byte("reconciler-test-key-0123456789")
	tests := []struct {
		name   string
		key    []byte
		inject func(t *testing.T, f *natsFixture)
		check  func(t *testing.T, r reconciler.Report)
	}{
		{"copied token", nil, func(t *testing.T, f *natsFixture) {
			b, _ := tokensem.Codec{}.Encode(tokensem.NewToken(f.name, 1, 1))
			f.publish(t, b)
		}, func(t *testing.T, r reconciler.Report) {
			if len(r.Duplicates) != 1 || r.Duplicates[0] != 1 {
				t.Errorf("duplicates = %v, want [1]", r.Duplicates)
			}
		}},
		{"deleted token", nil, func(t *testing.T, f *natsFixture) { f.deleteToken(t, 2) },
			func(t *testing.T, r reconciler.Report) {
				if len(r.Missing) != 1 || r.Missing[0] != 2 {
					t.Errorf("missing = %v, want [2]", r.Missing)
				}
			}},
		{"junk", nil, func(t *testing.T, f *natsFixture) { f.publish(t, []byte("junk")) },
			func(t *testing.T, r reconciler.Report) {
				if r.Invalid != 1 {
					t.Errorf("invalid = %d, want 1", r.Invalid)
				}
			}},
		{"forged", key, func(t *testing.T, f *natsFixture) {
			b, _ := tokensem.NewCodec([]byte("attacker-key-0123456789")).Encode(tokensem.NewToken(f.name, 0, 1))
			f.publish(t, b)
		}, func(t *testing.T, r reconciler.Report) {
			if r.Invalid != 1 || len(r.Duplicates) != 0 {
				t.Errorf("invalid = %d, duplicates %v; want the forgery invalid, not a duplicate", r.Invalid, r.Duplicates)
			}
		}},
		{"retired", nil, func(t *testing.T, f *natsFixture) {
			for _, tok := range []tokensem.Token{tokensem.NewToken(f.name, 7, 1), tokensem.NewToken(f.name, 0, 0)} {
				b, _ := tokensem.Codec{}.Encode(tok)
				f.publish(t, b)
			}
		}, func(t *testing.T, r reconciler.Report) {
			if r.Invalid != 2 {
				t.Errorf("invalid = %d, want 2 (index >= N, old epoch)", r.Invalid)
			}
		}},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newNATS(t, fmt.Sprintf("repair-%d", i), 3, tc.key)
			tc.inject(t, f)
			report := run(t, f, false)
			if report.Healthy {
				t.Fatalf("report-only run called the damaged semaphore healthy: %+v", report)
			}
			tc.check(t, report)
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
			st, err := f.sem.Status(context.Background())
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

// TestHeldDuplicate: the copy of a held slot is removed and the holder
// keeps its permit.
func TestHeldDuplicate(t *testing.T) {
	f := newNATS(t, "held-dup", 1, nil)
	p, err := f.sem.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := tokensem.Codec{}.Encode(tokensem.NewToken(f.name, 0, 1))
	f.publish(t, b)
	r := run(t, f, true)
	if r.Removed != 1 || !r.Healthy {
		t.Fatalf("repair of a held slot's copy: %+v", r)
	}
	if p.Err() != nil {
		t.Fatalf("holder lost its permit to the repair: %v", p.Err())
	}
	if _, err := f.sem.TryAcquire(context.Background()); !errors.Is(err, tokensem.ErrNoPermit) {
		t.Fatalf("second permit of N=1 after the repair: %v", err)
	}
	if err := p.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := f.usable(t); n != 1 {
		t.Fatalf("%d usable, want 1", n)
	}
}

// TestMissingWhileHeld: a held slot whose message vanished is not proven
// absent; it is issued only after its holder is gone.
func TestMissingWhileHeld(t *testing.T) {
	f := newNATS(t, "missing-held", 1, nil)
	p, err := f.sem.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	f.deleteToken(t, 0)
	if r := run(t, f, true); r.Issued != 0 {
		t.Fatalf("issued a token for a slot with a live holder: %+v", r)
	}
	if err := p.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	r := run(t, f, true)
	if r.Issued != 1 || !r.Healthy {
		t.Fatalf("after the holder released: %+v", r)
	}
	if n := f.usable(t); n != 1 {
		t.Fatalf("%d usable, want 1", n)
	}
}

// TestConcurrentReconcilers: two reconcilers repairing the same losses at
// once issue each missing slot exactly once.
func TestConcurrentReconcilers(t *testing.T) {
	for round := range 5 {
		f := newNATS(t, fmt.Sprintf("concurrent-%d", round), 4, nil)
		f.deleteToken(t, 1)
		f.deleteToken(t, 3)
		var wg sync.WaitGroup
		reports := make([]reconciler.Report, 2)
		for i := range reports {
			wg.Go(func() {
				r, err := reconciler.Run(context.Background(), f.sem.Inventory(), true)
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
		st, err := f.sem.Status(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if st.Tokens != 4 || !st.Healthy {
			t.Fatalf("round %d: %+v", round, st)
		}
	}
}

// BenchmarkCensus10k and BenchmarkRepair10k measure N = 10,000.
func BenchmarkCensus10k(b *testing.B) {
	f := newNATS(b, "census-10k", 10_000, nil)
	inv := f.sem.Inventory()
	for b.Loop() {
		if _, err := inv.Census(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRepair10k(b *testing.B) {
	f := newNATS(b, "repair-10k", 10_000, nil)
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		for j := range 100 { // 100 losses and 100 copies
			f.deleteToken(b, (i*100+j)%10_000)
			tok, _ := tokensem.Codec{}.Encode(tokensem.NewToken(f.name, (i*100+j+5000)%10_000, 1))
			f.publish(b, tok)
		}
		b.StartTimer()
		r, err := reconciler.Run(context.Background(), f.sem.Inventory(), true)
		if err != nil || !r.Healthy || r.Issued != 100 || r.Removed != 100 {
			b.Fatalf("repair: %+v %v", r, err)
		}
		b.ReportMetric(float64(r.Census.Milliseconds()), "census-ms")
		b.ReportMetric(float64(r.Repair.Milliseconds()), "repair-ms")
	}
}

package semtest

import (
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/tokensem/tokensem"
)

// recordCost bounds what reading one bad stored record may cost a client:
// every byte the process allocates meanwhile (an embedded broker's too).
const recordCost = 10 << 20

// runaway is how far the heap may grow while a bounded call runs before
// allocated stops the whole test binary: a check that fails must not take
// the machine's memory with it (a 2e9-permit configuration once grew a
// client to 22.7 GB).
const runaway = 512 << 20

// allocated runs fn and returns how many bytes the process allocated
// meanwhile. If the heap grows by more than runaway first, it panics.
func allocated(t testing.TB, fn func()) uint64 {
	t.Helper()
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	done := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			if m.HeapAlloc > before.HeapAlloc+runaway {
				panic(fmt.Sprintf("%s: the heap grew by %d MB while reading one stored record: stopping before the machine runs out",
					t.Name(), (m.HeapAlloc-before.HeapAlloc)>>20))
			}
		}
	}()
	fn()
	close(done)
	<-watched
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// maxEcho is the most of a record an error may quote, with the error's own
// words around it.
const maxEcho = 512

// badConfigs are configurations a hostile or broken writer could leave:
// each is made from the stored one (a JSON object).
var badConfigs = []struct {
	name string
	edit func(t testing.TB, old []byte) []byte
}{
	{"Garbage100kB", func(testing.TB, []byte) []byte {
		return []byte(strings.Repeat("\x00garbage\xff", 10<<10))
	}},
	{"Oversized100kB", func(t testing.TB, old []byte) []byte {
		// Every field as stored, valid, plus 100 kB that no reader needs.
		return EditJSON(t, old, "pad", strings.Repeat("x", 100<<10))
	}},
	{"TwoBillionPermits", func(t testing.TB, old []byte) []byte {
		return EditJSON(t, old, "permits", 2_000_000_000)
	}},
}

// EditJSON returns the JSON object old with key set to v.
func EditJSON(t testing.TB, old []byte, key string, v any) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(old, &m); err != nil {
		t.Fatalf("the stored configuration is not a JSON object: %v", err)
	}
	m[key] = v
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// testInvalidConfig: a configuration that is garbage, too large, or out of
// bounds fails that semaphore alone, cheaply and with a clipped error
// (ErrInvalidRecord): Open and Status refuse it within recordCost; List
// names it as "invalid" and lists the others; Init and Delete refuse it
// (Init naming ForceDelete); ForceDelete removes it, telling its holder,
// and the name is then free for an Init.
func testInvalidConfig(t *testing.T, b Backend) {
	if b.ReplaceConfig == nil || b.Delete == nil {
		t.Skip("the backend cannot replace a configuration, or delete")
	}
	good := uniqueName(t) + "-good"
	mustInit(t, b, good, 1, Options{})
	type fixture struct {
		name string
		p    tokensem.Permit
	}
	fixtures := make([]fixture, len(badConfigs))
	// One at a time: the allocations of one read are measured.
	for i, bc := range badConfigs {
		name := fmt.Sprintf("%s-%d", uniqueName(t), i)
		s := mustInit(t, b, name, 2, Options{Lease: 2 * time.Second})
		fixtures[i] = fixture{name, mustAcquire(t, s, 10*time.Second)}
		b.ReplaceConfig(t, name, func(old []byte) []byte { return bc.edit(t, old) })

		var openErr, statusErr error
		cost := allocated(t, func() {
			ctx := Context(t, 30*time.Second)
			_, statusErr = s.Status(ctx)
			if o, err := b.Open(t, b.Addr, name, Options{}); err == nil {
				_, _ = o.Status(ctx)
				_ = o.Close()
			} else {
				openErr = err
			}
		})
		t.Logf("%s: open: %v (the calls allocated %d kB)", bc.name, openErr, cost>>10)
		if cost > recordCost {
			t.Errorf("%s: opening and taking the status of %s allocated %d MB, more than %d MB", bc.name, name, cost>>20, recordCost>>20)
		}
		checkInvalid(t, bc.name+": open", openErr)
		checkInvalid(t, bc.name+": status of a handle opened before", statusErr)

		_, err := b.Init(t, b.Addr, name, 2, Options{})
		checkInvalid(t, bc.name+": init", err)
		if err != nil && !strings.Contains(err.Error(), "ForceDelete") {
			t.Errorf("%s: init of an invalid semaphore: %v\nwant it to say that ForceDelete removes it", bc.name, err)
		}
		checkInvalid(t, bc.name+": delete", b.Delete(t, name, false))
	}

	infos, err := b.List(t)
	if err != nil {
		t.Fatalf("list with invalid configurations on the broker: %v", err)
	}
	found := map[string]tokensem.Info{}
	for _, in := range infos {
		found[in.Name] = in
	}
	for _, f := range fixtures {
		if in := found[f.name]; in.State != "invalid" || in.Warning == "" || len(in.Warning) > maxEcho {
			t.Errorf("list shows %s as %+v, want state invalid and a warning of at most %d bytes", f.name, in, maxEcho)
		}
	}
	if in := found[good]; in.State != "ready" || in.Permits != 1 {
		t.Errorf("list shows the valid %s as %+v", good, in)
	}

	t.Run("ForceDelete", func(t *testing.T) {
		for i, bc := range badConfigs {
			f := fixtures[i]
			t.Run(bc.name, func(t *testing.T) {
				t.Parallel() // each waits out its holder
				start := time.Now()
				if err := b.Delete(t, f.name, true); err != nil {
					t.Fatalf("force delete: %v", err)
				}
				t.Logf("force delete took %v", time.Since(start).Round(time.Millisecond))
				select {
				case <-f.p.Done():
					if !errors.Is(f.p.Err(), tokensem.ErrLeaseLost) {
						t.Errorf("holder: Err = %v, want ErrLeaseLost", f.p.Err())
					}
				default:
					t.Errorf("force delete returned while the holder had not learned of its loss")
				}
				if _, err := b.Open(t, b.Addr, f.name, Options{}); !errors.Is(err, tokensem.ErrNotInitialized) {
					t.Fatalf("open after force delete: err = %v, want ErrNotInitialized", err)
				}
				again := mustInit(t, b, f.name, 3, Options{})
				settled(t, again, "init after the force delete", func(st tokensem.Status) bool {
					return st.Permits == 3 && st.Tokens == 3 && st.Healthy
				})
			})
		}
	})
}

// checkInvalid checks that err says a stored record is invalid
// (ErrInvalidRecord) and quotes at most maxEcho bytes in all.
func checkInvalid(t testing.TB, what string, err error) {
	t.Helper()
	switch {
	case !errors.Is(err, tokensem.ErrInvalidRecord):
		t.Errorf("%s: err = %.300v, want ErrInvalidRecord", what, err)
	case len(err.Error()) > maxEcho:
		t.Errorf("%s: the error is %d bytes long (at most %d): %.300s…", what, len(err.Error()), maxEcho, err)
	}
}

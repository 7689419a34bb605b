package natssem_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/natssem"
)

// TestClassesUpgrade: a semaphore whose token consumer serves arrival
// order only (made on a server before 2.12; the test makes one by taking
// the policy off a consumer and the group out of the configuration) serves
// classes after an Init on a server that can, in place: a permit held
// across the upgrade stays held and releases; a handle that cached the
// configuration from before still acquires (its pulls name the group on
// either consumer); waiters queued low class first
// are served high class first. On one server, for a key of a group, and
// on the 3-node cluster (R3).
func TestClassesUpgrade(t *testing.T) {
	for _, tc := range classLayouts("upgrades") {
		t.Run(tc.name, func(t *testing.T) {
			addrs := tc.addrs(t)
			at := func(i int) string { return addrs[i%len(addrs)] }
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			name := fmt.Sprintf("upgrade-%s-%d", tc.name, time.Now().UnixNano())
			const lease = 2 * time.Second
			opts := append([]natssem.Option{natssem.WithLease(lease)}, tc.opts...)
			s, err := natssem.Init(ctx, connect(t, at(0)), name, 1, opts...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_ = s.Close()
				_ = natssem.ForceDelete(context.WithoutCancel(ctx), connect(t, at(0)), name, tc.opts...)
			})
			res := natssem.ResourcesOf(name, tc.group)
			js, err := jetstream.New(connect(t, at(0)))
			if err != nil {
				t.Fatal(err)
			}
			setPolicy := func(p jetstream.PriorityPolicy) jetstream.PriorityPolicy {
				t.Helper()
				c, err := js.Consumer(ctx, res.Stream, res.Consumer)
				if err != nil {
					t.Fatal(err)
				}
				if p == jetstream.PriorityPolicyNone {
					cc := c.CachedInfo().Config
					cc.PriorityPolicy, cc.PriorityGroups = jetstream.PriorityPolicyNone, nil
					if c, err = js.UpdateConsumer(ctx, res.Stream, cc); err != nil {
						t.Fatalf("take the policy off the consumer: %v", err)
					}
				}
				return c.CachedInfo().Config.PriorityPolicy
			}
			if got := setPolicy(jetstream.PriorityPolicyNone); got != jetstream.PriorityPolicyNone {
				t.Fatalf("the consumer's policy after taking it off: %v", got)
			}
			dropGroup(t, at(0), res)

			// Handles of the semaphore as made before 2.12.
			stale, err := natssem.Open(ctx, connect(t, at(1)), name, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer stale.Close()
			stale2, err := natssem.Open(ctx, connect(t, at(2)), name, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer stale2.Close()
			if _, err := stale.Acquire(tokensem.WithPriority(ctx, 2)); !errors.Is(err, tokensem.ErrPriorityUnsupported) {
				t.Fatalf("a class 2 wait before the upgrade: %v, want ErrPriorityUnsupported", err)
			}
			held, err := stale.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}

			up, err := natssem.Init(ctx, connect(t, at(2)), name, 1, opts...)
			if err != nil {
				t.Fatalf("the upgrading Init: %v", err)
			}
			defer up.Close()
			if got := setPolicy(jetstream.PriorityPolicyPrioritized); got != jetstream.PriorityPolicyPrioritized {
				t.Fatalf("the consumer's policy after Init: %v, want prioritized", got)
			}
			// Within configTTL of its read, stale2's configuration names
			// no group; its pull does, and the one permit is held.
			if p, err := stale2.TryAcquire(ctx); !errors.Is(err, tokensem.ErrNoPermit) {
				t.Fatalf("TryAcquire beside the permit held across the upgrade: %v, %v; want ErrNoPermit", p, err)
			}
			// The holder renews across the update for two leases and more:
			// its token is not delivered again.
			time.Sleep(2*lease + lease/2)
			if err := held.Err(); err != nil {
				t.Fatalf("the permit held across the upgrade: %v", err)
			}
			if p, err := up.TryAcquire(ctx); !errors.Is(err, tokensem.ErrNoPermit) {
				t.Fatalf("TryAcquire two leases after the upgrade, the permit held: %v, %v; want ErrNoPermit", p, err)
			}
			if err := held.Release(ctx); err != nil {
				t.Fatalf("releasing the permit held across the upgrade: %v", err)
			}
			holder, err := stale.Acquire(ctx)
			if err != nil {
				t.Fatalf("the handle that cached the configuration from before: %v", err)
			}

			classes := []tokensem.Priority{-1, 0, 2}
			var (
				mu    sync.Mutex
				order []tokensem.Priority
				wg    sync.WaitGroup
			)
			for i, class := range classes {
				w, err := natssem.Open(ctx, connect(t, at(i)), name, tc.opts...)
				if err != nil {
					t.Fatal(err)
				}
				defer w.Close()
				wg.Go(func() {
					p, err := w.Acquire(tokensem.WithPriority(ctx, class))
					if err != nil {
						t.Errorf("class %d: %v", class, err)
						return
					}
					mu.Lock()
					order = append(order, class)
					mu.Unlock()
					_ = p.Release(ctx)
				})
				deadline := time.Now().Add(10 * time.Second)
				for {
					st, err := up.Status(ctx)
					if err == nil && st.Waiting >= i+1 {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("waiter %d never queued (last: %+v, %v)", i, st, err)
					}
					time.Sleep(5 * time.Millisecond)
				}
			}
			if err := holder.Release(ctx); err != nil {
				t.Fatal(err)
			}
			wg.Wait()
			if fmt.Sprint(order) != fmt.Sprint([]tokensem.Priority{2, 0, -1}) {
				t.Fatalf("served in classes %v, want [2 0 -1] (queued %v)", order, classes)
			}
		})
	}
}

// classLayouts are the layouts the class tests run on: one server, a key
// of group, and the 3-node cluster (R3).
func classLayouts(group string) []classLayout {
	return []classLayout{
		{name: "single", addrs: singleAddrs},
		{name: "group", addrs: singleAddrs, opts: []natssem.Option{natssem.WithGroup(group)}, group: group},
		{name: "cluster", addrs: clusterAddrs, opts: []natssem.Option{natssem.WithReplicas(3)}},
	}
}

type classLayout struct {
	name  string
	addrs func(t *testing.T) []string // servers to connect through, in turn
	opts  []natssem.Option
	group string
}

// dropGroup takes the priority group out of the semaphore's stored
// configuration (through the server at addr), as a semaphore made before
// 2.12, or an Init that met a refusal, leaves it.
func dropGroup(t testing.TB, addr string, res natssem.Resources) {
	t.Helper()
	replaceRecord(t, addr, res.Bucket, res.KeyPrefix+"config", func(old []byte) []byte {
		var m map[string]any
		d := json.NewDecoder(bytes.NewReader(old))
		d.UseNumber() // the epoch is a uint64
		if err := d.Decode(&m); err != nil {
			t.Fatal(err)
		}
		if m["priority_group"] == nil {
			t.Fatalf("the configuration names no priority group: %s", old)
		}
		delete(m, "priority_group")
		b, _ := json.Marshal(m)
		return b
	})
}

// handOff has w wait for a permit of the semaphore that s is a handle
// of, releases held once s's Status counts the waiter, and returns once
// w holds the permit and has released it.
func handOff(t *testing.T, ctx context.Context, held tokensem.Permit, s, w tokensem.Semaphore) {
	t.Helper()
	got := make(chan error, 1)
	go func() {
		p, err := w.Acquire(ctx)
		if err == nil {
			err = p.Release(ctx)
		}
		got <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if st, err := s.Status(ctx); err == nil && st.Waiting >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the waiter never queued") // its Acquire ends with ctx
		}
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the waiter handed the permit: %v", err)
	}
}

// TestPullsSuitEitherPolicy: a token consumer that serves pulls by class
// while the configuration says it serves arrival order only, as a cluster
// part-way through an upgrade to nats-server 2.12 leaves it (the newer
// servers took the policy, the older one refused it, and Init wrote the
// configuration back without the group; seen with 2.11 beside 2.15: every
// pull without the group was refused 400 once a newer server led the
// consumer). Waits in class 0 are served, by TryAcquire and through a
// waiter's handoff; a class other than 0 is refused as the configuration
// says. An Init then updates the consumer again, although its leader reads
// prioritized, and classes are served. On one server, for a key of a
// group, and on the 3-node cluster.
func TestPullsSuitEitherPolicy(t *testing.T) {
	for _, tc := range classLayouts("eitherpolicy") {
		t.Run(tc.name, func(t *testing.T) {
			addrs := tc.addrs(t)
			at := func(i int) string { return addrs[i%len(addrs)] }
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			name := fmt.Sprintf("either-%s-%d", tc.name, time.Now().UnixNano())
			s, err := natssem.Init(ctx, connect(t, at(0)), name, 1, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_ = s.Close()
				_ = natssem.ForceDelete(context.WithoutCancel(ctx), connect(t, at(0)), name, tc.opts...)
			})
			res := natssem.ResourcesOf(name, tc.group)
			js, err := jetstream.New(connect(t, at(0)))
			if err != nil {
				t.Fatal(err)
			}
			c, err := js.Consumer(ctx, res.Stream, res.Consumer)
			if err != nil {
				t.Fatal(err)
			}
			if got := c.CachedInfo().Config.PriorityPolicy; got != jetstream.PriorityPolicyPrioritized {
				t.Fatalf("the consumer's policy: %v, want prioritized", got)
			}
			dropGroup(t, at(0), res)
			a, err := natssem.Open(ctx, connect(t, at(1)), name, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			w, err := natssem.Open(ctx, connect(t, at(2)), name, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()

			if _, err := a.Acquire(tokensem.WithPriority(ctx, 1)); !errors.Is(err, tokensem.ErrPriorityUnsupported) {
				t.Fatalf("a class 1 wait: %v, want ErrPriorityUnsupported (the configuration names no group)", err)
			}
			held, err := a.TryAcquire(ctx)
			if err != nil {
				t.Fatalf("TryAcquire of the free permit: %v", err)
			}
			handOff(t, ctx, held, a, w)
			p, err := a.Acquire(ctx)
			if err != nil {
				t.Fatalf("Acquire after the handoff: %v", err)
			}
			if err := p.Release(ctx); err != nil {
				t.Fatal(err)
			}

			// An Init sends the update although the consumer's leader
			// reads prioritized: a server that refused the policy may keep
			// its own copy without it, which a read from the leader cannot
			// see. Seen by the consumer create/update requests.
			watch := connect(t, at(0))
			updates, err := watch.SubscribeSync("$JS.API.CONSUMER.CREATE." + res.Stream + ".>")
			if err != nil {
				t.Fatal(err)
			}
			if err := watch.Flush(); err != nil {
				t.Fatal(err)
			}
			up, err := natssem.Init(ctx, connect(t, at(1)), name, 1, tc.opts...)
			if err != nil {
				t.Fatalf("the Init after: %v", err)
			}
			defer up.Close()
			// The requests reach the watching connection on their own way.
			n := 0
			for deadline := time.Now().Add(5 * time.Second); n < 1 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				n, _, _ = updates.Pending()
			}
			if err := watch.Flush(); err != nil {
				t.Fatal(err)
			}
			if n, _, _ = updates.Pending(); n != 1 {
				t.Errorf("the Init sent %d consumer updates, want 1", n)
			}
			hp, err := up.Acquire(tokensem.WithPriority(ctx, 1))
			if err != nil {
				t.Fatalf("a class 1 wait after the Init: %v", err)
			}
			_ = hp.Release(ctx)
		})
	}
}

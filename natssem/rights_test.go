package natssem_test

// The role tests of docs/permissions-nats.md at library level: a server
// whose users have exactly the documented permission blocks; each role
// does its job, and everything it tries on another semaphore (or key) is
// refused with tokensem.ErrPermissionDenied, at once.

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/adaptive"
	"github.com/tokensem/tokensem/internal/natstest"
	"github.com/tokensem/tokensem/natssem"
	"github.com/tokensem/tokensem/natssem/embedded"
	"github.com/tokensem/tokensem/reconciler"
)

// Timing of the role tests. A refusal must end a call by itself: every
// call runs under refusalBudget, well below one round trip's timeout
// (rightsTimeout), so a refusal noticed only when a request timed out
// fails the test with a deadline error instead.
const (
	rightsLease   = time.Minute
	rightsTimeout = 30 * time.Second
	refusalBudget = 10 * time.Second
)

// rightsServer starts a server with the users of docs/permissions-nats.md.
func rightsServer(t *testing.T) *embedded.Server {
	t.Helper()
	blocks, err := natstest.RoleBlocks("../docs/permissions-nats.md")
	if err != nil {
		t.Fatal(err)
	}
	s, err := natstest.StartWithRoles(t.TempDir(), blocks)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

// connectAs connects as user, with the inbox prefix the documented
// permissions give it.
func connectAs(t *testing.T, s *embedded.Server, user string, extra ...nats.Option) *nats.Conn {
	t.Helper()
	opts := append([]nats.Option{nats.UserInfo(user, natstest.Password(user)),
		nats.CustomInboxPrefix(natstest.InboxPrefix(user))}, extra...)
	nc, err := nats.Connect(s.URL(), opts...)
	if err != nil {
		t.Fatalf("connect as %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// rightsOpts are the options every role test uses: a round trip timeout
// far above refusalBudget.
func rightsOpts(extra ...natssem.Option) []natssem.Option {
	return append([]natssem.Option{natssem.WithRequestTimeout(rightsTimeout)}, extra...)
}

// must runs a role's operation and fails the test if it fails.
func must(t *testing.T, what string, op func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := op(ctx); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// refusal is an operation a role must be refused, and a piece of the
// subject the error must name.
type refusal struct {
	name    string
	subject string
	op      func(ctx context.Context) error
}

// checkRefused runs each operation and checks it fails with
// tokensem.ErrPermissionDenied naming subject, within refusalBudget.
func checkRefused(t *testing.T, cases []refusal) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), refusalBudget)
			defer cancel()
			start := time.Now()
			err := tc.op(ctx)
			if ctx.Err() != nil {
				t.Fatalf("refused only when the budget ran out (%v): %v", refusalBudget, err)
			}
			if !errors.Is(err, tokensem.ErrPermissionDenied) {
				t.Fatalf("err = %v, want tokensem.ErrPermissionDenied (after %v)", err, time.Since(start))
			}
			if !strings.Contains(err.Error(), tc.subject) {
				t.Errorf("err = %v, want it to name %q", err, tc.subject)
			}
			t.Logf("refused after %v: %v", time.Since(start).Round(time.Millisecond), err)
		})
	}
}

func openOp(nc *nats.Conn, name string, opts ...natssem.Option) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		s, err := natssem.Open(ctx, nc, name, rightsOpts(opts...)...)
		if err == nil {
			_ = s.Close()
		}
		return err
	}
}

func initOp(nc *nats.Conn, name string, opts ...natssem.Option) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		s, err := natssem.Init(ctx, nc, name, 2, rightsOpts(append(opts, natssem.WithLease(rightsLease))...)...)
		if err == nil {
			_ = s.Close()
		}
		return err
	}
}

// clientCycle is what a client does: acquire, try, weighted, status, count.
func clientCycle(t *testing.T, nc *nats.Conn, name string, opts ...natssem.Option) {
	t.Helper()
	must(t, "client cycle of "+name, func(ctx context.Context) error {
		s, err := natssem.Open(ctx, nc, name, rightsOpts(opts...)...)
		if err != nil {
			return err
		}
		defer func() { _ = s.Close() }()
		p, err := s.Acquire(ctx)
		if err != nil {
			return err
		}
		if err := p.Release(ctx); err != nil {
			return err
		}
		if p, err = s.TryAcquire(ctx); err != nil {
			return err
		}
		if err := p.Release(ctx); err != nil {
			return err
		}
		for range 2 { // the first makes the gate
			ps, err := s.AcquireN(ctx, 2)
			if err != nil {
				return err
			}
			if err := ps.Release(ctx); err != nil {
				return err
			}
		}
		st, err := s.Status(ctx)
		if err != nil {
			return err
		}
		if !st.Healthy {
			t.Errorf("status of %s: %+v, want healthy", name, st)
		}
		if _, _, err := s.ControllerRecord(ctx); err != nil { // seminit status reads it
			return err
		}
		_, err = s.Count(ctx)
		return err
	})
}

// adminCycle is what an admin does to its semaphore: init, resize,
// reconcile, delete, init again, delete --force.
func adminCycle(t *testing.T, nc *nats.Conn, name string, opts ...natssem.Option) {
	t.Helper()
	must(t, "admin cycle of "+name, func(ctx context.Context) error {
		s, err := natssem.Init(ctx, nc, name, 3, rightsOpts(append(opts, natssem.WithLease(rightsLease))...)...)
		if err != nil {
			return err
		}
		defer func() { _ = s.Close() }()
		if _, err := s.Resize(ctx, 4); err != nil {
			return err
		}
		rec := adaptive.Record{By: "adminCycle", Leader: "x-adapt", Min: 1, Max: 4}
		if err := s.RecordController(ctx, rec); err != nil {
			return err
		}
		if got, ok, err := s.ControllerRecord(ctx); err != nil || !ok || got.By != rec.By {
			t.Errorf("the controller record of %s: %+v, %v, %v", name, got, ok, err)
		}
		r, err := reconciler.Run(ctx, s.Inventory(), true)
		if err != nil {
			return err
		}
		if !r.Healthy {
			t.Errorf("reconcile of %s: %+v, want healthy", name, r)
		}
		return nil
	})
}

// waiterOutlivesRefusal checks that a refusal of another semaphore's
// subject (refusedOp, on nc) does not end a call of semaphore name waiting
// on the same connection: the waiter still gets the permit released after.
func waiterOutlivesRefusal(t *testing.T, root, nc *nats.Conn, name string, refusedOp func(ctx context.Context) error, opts ...natssem.Option) {
	t.Helper()
	must(t, "a waiter of "+name+" outlives a refusal of another", func(ctx context.Context) error {
		s, err := natssem.Open(ctx, nc, name, rightsOpts(opts...)...)
		if err != nil {
			return err
		}
		defer func() { _ = s.Close() }()
		var held []tokensem.Permit
		for range s.Permits() {
			p, err := s.Acquire(ctx)
			if err != nil {
				return err
			}
			held = append(held, p)
		}
		got := make(chan error, 1)
		go func() {
			p, err := s.Acquire(ctx)
			if err == nil {
				err = p.Release(ctx)
			}
			got <- err
		}()
		watch, err := natssem.Open(ctx, root, name, opts...)
		if err != nil {
			return err
		}
		defer func() { _ = watch.Close() }()
		for {
			st, err := watch.Status(ctx)
			if err != nil {
				return err
			}
			if st.Waiting > 0 {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		// Returns once the refusal was heard, and every guard on nc told.
		if err := refusedOp(ctx); !errors.Is(err, tokensem.ErrPermissionDenied) {
			t.Errorf("the other semaphore: err = %v, want tokensem.ErrPermissionDenied", err)
		}
		for _, p := range held {
			if err := p.Release(ctx); err != nil {
				return err
			}
		}
		if err := <-got; err != nil {
			t.Errorf("the waiter of %s: %v, want a permit", name, err)
		}
		return nil
	})
}

// TestRightsLone: the roles of a lone semaphore A, and their refusals on B.
func TestRightsLone(t *testing.T) {
	srv := rightsServer(t)
	root := connectAs(t, srv, natstest.RootUser)
	// B, with its gate, made by a user with every right.
	must(t, "root makes B", func(ctx context.Context) error {
		s, err := natssem.Init(ctx, root, "B", 2, natssem.WithLease(rightsLease))
		if err != nil {
			return err
		}
		defer func() { _ = s.Close() }()
		ps, err := s.AcquireN(ctx, 2)
		if err != nil {
			return err
		}
		return ps.Release(ctx)
	})
	admin := connectAs(t, srv, "a_admin")
	client := connectAs(t, srv, "a_client")
	operator := connectAs(t, srv, "operator")

	adminCycle(t, admin, "A")
	clientCycle(t, client, "A")
	must(t, "operator lists", func(ctx context.Context) error {
		infos, err := natssem.List(ctx, operator)
		if err != nil {
			return err
		}
		var names []string
		for _, in := range infos {
			names = append(names, in.Name)
		}
		if got := strings.Join(names, ","); !strings.Contains(got, "A") || !strings.Contains(got, "B") {
			t.Errorf("list = %s, want A and B", got)
		}
		return nil
	})

	waiterOutlivesRefusal(t, root, client, "A", openOp(client, "B"))

	deleteOp := func(nc *nats.Conn, name string) func(ctx context.Context) error {
		return func(ctx context.Context) error { return natssem.Delete(ctx, nc, name, rightsOpts()...) }
	}
	forceOp := func(nc *nats.Conn, name string) func(ctx context.Context) error {
		return func(ctx context.Context) error { return natssem.ForceDelete(ctx, nc, name, rightsOpts()...) }
	}
	listOp := func(nc *nats.Conn) func(ctx context.Context) error {
		return func(ctx context.Context) error { _, err := natssem.List(ctx, nc); return err }
	}
	checkRefused(t, []refusal{
		{"client opens B", "KV_tokensem_B", openOp(client, "B")},
		{"client inits B", "TOKENSEM_B", initOp(client, "B")},
		{"client deletes B", "_B", deleteOp(client, "B")},
		{"client force-deletes B", "_B", forceOp(client, "B")},
		{"client lists", "$JS.API.STREAM.NAMES", listOp(client)},
		{"client inits A", "TOKENSEM_A", initOp(client, "A2")},
		{"client deletes A", "_A", deleteOp(client, "A")},
		{"admin opens B", "_B", openOp(admin, "B")},
		{"admin inits B", "_B", initOp(admin, "B")},
		{"admin deletes B", "_B", deleteOp(admin, "B")},
		{"admin force-deletes B", "_B", forceOp(admin, "B")},
		{"admin lists", "$JS.API.STREAM.NAMES", listOp(admin)},
		{"operator opens A", "tokensem_A", openOp(operator, "A")},
		{"operator inits C", "_C", initOp(operator, "C")},
		{"operator deletes A", "_A", deleteOp(operator, "A")},
	})

	// A client whose inbox prefix is not its own is refused its inboxes.
	stray := connectAs(t, srv, "a_client", nats.CustomInboxPrefix("_INBOX"))
	checkRefused(t, []refusal{{"client with the default inbox prefix", "_INBOX.", openOp(stray, "A")}})

	// The admin's delete and delete --force, last: the client is done.
	must(t, "admin deletes A", deleteOp(admin, "A"))
	must(t, "admin makes A again", initOp(admin, "A"))
	must(t, "admin force-deletes A", forceOp(admin, "A"))
}

// TestRightsGroup: the roles of key k1 of group G, and their refusals on
// key k2 and group G2.
func TestRightsGroup(t *testing.T) {
	srv := rightsServer(t)
	in := natssem.WithGroup("G")
	root := connectAs(t, srv, natstest.RootUser)
	must(t, "root makes k2 of G and G2", func(ctx context.Context) error {
		for _, g := range []string{"G", "G2"} {
			s, err := natssem.Init(ctx, root, "k2", 2, natssem.WithGroup(g), natssem.WithLease(rightsLease))
			if err != nil {
				return err
			}
			_ = s.Close()
		}
		return nil
	})
	admin := connectAs(t, srv, "k1_admin")
	client := connectAs(t, srv, "k1_client")
	operator := connectAs(t, srv, "g_operator")

	adminCycle(t, admin, "k1", in)
	clientCycle(t, client, "k1", in)
	must(t, "operator lists G", func(ctx context.Context) error {
		infos, err := natssem.List(ctx, operator, in)
		if err != nil {
			return err
		}
		var names []string
		for _, in := range infos {
			names = append(names, in.Name)
		}
		if got := strings.Join(names, ","); !strings.Contains(got, "k1") || !strings.Contains(got, "k2") {
			t.Errorf("list = %s, want k1 and k2", got)
		}
		return nil
	})

	waiterOutlivesRefusal(t, root, client, "k1", openOp(client, "k2", in), in)

	deleteOp := func(nc *nats.Conn, name string, opts ...natssem.Option) func(ctx context.Context) error {
		return func(ctx context.Context) error { return natssem.Delete(ctx, nc, name, rightsOpts(opts...)...) }
	}
	forceOp := func(nc *nats.Conn, name string, opts ...natssem.Option) func(ctx context.Context) error {
		return func(ctx context.Context) error { return natssem.ForceDelete(ctx, nc, name, rightsOpts(opts...)...) }
	}
	listOp := func(nc *nats.Conn, opts ...natssem.Option) func(ctx context.Context) error {
		return func(ctx context.Context) error { _, err := natssem.List(ctx, nc, opts...); return err }
	}
	other := natssem.WithGroup("G2")
	checkRefused(t, []refusal{
		{"client opens k2", "holders_k2", openOp(client, "k2", in)},
		{"client inits k2", "k2", initOp(client, "k2", in)},
		{"client deletes k2", "k2", deleteOp(client, "k2", in)},
		{"client force-deletes k2", "k2", forceOp(client, "k2", in)},
		{"client opens k1 of G2", "G2", openOp(client, "k1", other)},
		{"client lists G", "KV_tokensemg_G", listOp(client, in)},
		{"admin opens k2", "k2", openOp(admin, "k2", in)},
		{"admin inits k2", "k2", initOp(admin, "k2", in)},
		{"admin deletes k2", "k2", deleteOp(admin, "k2", in)},
		{"admin force-deletes k2", "k2", forceOp(admin, "k2", in)},
		{"admin inits k1 of G2", "G2", initOp(admin, "k1", other)},
		{"admin lists", "$JS.API.STREAM.NAMES", listOp(admin)},
		{"operator opens k1", "TOKENSEMG_G", openOp(operator, "k1", in)},
		{"operator lists G2", "G2", listOp(operator, other)},
	})

	must(t, "admin deletes k1", deleteOp(admin, "k1", in))
	must(t, "admin makes k1 again", initOp(admin, "k1", in))
	must(t, "admin force-deletes k1", forceOp(admin, "k1", in))
}

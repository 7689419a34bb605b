package amqpsem_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/adaptive"
	"github.com/tokensem/tokensem/amqpsem"
	"github.com/tokensem/tokensem/internal/ids"
	"github.com/tokensem/tokensem/internal/semtest"
	"github.com/tokensem/tokensem/reconciler"
)

// rightsVhost makes a vhost of its own for a test, where guest may do
// anything, and returns guest's URL for it; a cleanup deletes the vhost
// and everything in it.
func rightsVhost(t testing.TB) (vhost, guestURL string) {
	t.Helper()
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and no rabbitmqctl: %v", err)
		}
		t.Skipf("no rabbitmqctl: %v", err)
	}
	return makeVhost(t, "amqp-rights-")
}

// rightsUser makes a user (removed by a cleanup) with permissions p in
// vhost only, and returns its URL.
func rightsUser(t testing.TB, vhost string, p amqpsem.Permissions) string {
	t.Helper()
	user, pass := "amqp-rights-"+ids.New()[:10], ids.New()
	rabbitctl(t, "add_user", user, pass)
	t.Cleanup(func() { rabbitctl(t, "delete_user", user) })
	rabbitctl(t, "set_permissions", "-p", vhost, user, p.Configure, p.Write, p.Read)
	return vhostURL(t, vhost, user, pass)
}

func dialURL(t testing.TB, u string, opts ...amqpsem.DialOption) *amqpsem.Conn {
	t.Helper()
	c, err := amqpsem.Dial(t.Context(), u, opts...)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// wantDenied checks that err is a permission refusal naming perm on
// resource, returned at once: a refusal retried until ctx ends would take
// the test's minute.
func wantDenied(t testing.TB, what string, err error, took time.Duration, perm, resource string) {
	t.Helper()
	t.Logf("%s: %v", what, err)
	switch {
	case !errors.Is(err, tokensem.ErrPermissionDenied):
		t.Errorf("%s: %v, want ErrPermissionDenied", what, err)
	case !strings.Contains(err.Error(), perm+" permission on "+resource):
		t.Errorf("%s: %v, want it to name %q on %s", what, err, perm, resource)
	case errors.Is(err, tokensem.ErrUnavailable):
		t.Errorf("%s: %v matches ErrUnavailable, which is retried", what, err)
	case took > tokensem.DefaultRequestTimeout:
		t.Errorf("%s: refused after %v: retried", what, took)
	}
}

// TestRoles: each role of docs/permissions-rabbitmq.md, as a RabbitMQ
// user with exactly its permissions, does its work on its own semaphore,
// and everything it tries on another semaphore is refused at once, naming
// the permission. Semaphore A was made as the amqpsem before per-semaphore
// exchanges made it (no exchange): its clients need nothing new, and its
// admin's first write gives it one.
func TestRoles(t *testing.T) {
	t.Parallel()
	vhost, guestURL := rightsVhost(t)
	a, b := "sem", "sem-b" // b's name starts with a's
	ctx := semtest.Context(t, 3*time.Minute)
	guest := dialURL(t, guestURL)
	operator := dialURL(t, rightsUser(t, vhost, amqpsem.OperatorPermissions()))
	adminA := dialURL(t, rightsUser(t, vhost, amqpsem.AdminPermissions(a)))
	clientA := dialURL(t, rightsUser(t, vhost, amqpsem.ClientPermissions(a)))

	// The operator's List sets the registry up; before it, an admin of
	// one semaphore cannot register one.
	if _, err := amqpsem.Init(ctx, adminA, a, 2); !errors.Is(err, tokensem.ErrPermissionDenied) {
		t.Fatalf("admin's Init before the registry is set up: %v, want ErrPermissionDenied", err)
	}
	if infos, err := amqpsem.List(ctx, operator); err != nil || len(infos) != 0 {
		t.Fatalf("operator's first List: %v, %v", infos, err)
	}
	sb, err := amqpsem.Init(ctx, guest, b, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()

	// A in the layout before exchanges: made, then its exchange removed.
	ga, err := amqpsem.Init(ctx, guest, a, 2)
	if err != nil {
		t.Fatal(err)
	}
	ga.Close()
	rawDo(t, guestURL, func(ch *amqp.Channel) error { return ch.ExchangeDelete("tokensem."+a+".x", false, false) })

	t.Run("client", func(t *testing.T) {
		s, err := amqpsem.Open(ctx, clientA, a, amqpsem.WithOrphanRepair(0))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		p, err := s.Acquire(ctx)
		if err != nil {
			t.Fatalf("acquire: %v", err)
		}
		st, err := s.Status(ctx)
		if err != nil || !st.Healthy || st.Held != 1 {
			t.Errorf("status: %+v, %v", st, err)
		}
		if err := p.Release(ctx); err != nil {
			t.Errorf("release: %v", err)
		}
		ps, err := s.AcquireN(ctx, 2) // makes the gate
		if err != nil {
			t.Fatalf("acquireN: %v", err)
		}
		if err := ps.Release(ctx); err != nil {
			t.Errorf("release of the set: %v", err)
		}
		if p, err = s.TryAcquire(ctx); err != nil {
			t.Fatalf("try acquire: %v", err)
		}
		_ = p.Release(ctx)
		if _, err := s.Count(ctx); err != nil {
			t.Errorf("count: %v", err)
		}
	})

	t.Run("admin", func(t *testing.T) {
		s, err := amqpsem.Init(ctx, adminA, a, 2)
		if err != nil {
			t.Fatalf("init of an existing semaphore: %v", err)
		}
		defer s.Close()
		if _, err := s.Resize(ctx, 3); err != nil {
			t.Fatalf("resize of a semaphore without an exchange: %v", err)
		}
		if err := s.RecordController(ctx, adaptive.Record{By: "admin", Leader: "x-adapt", Min: 1, Max: 4}); err != nil {
			t.Fatalf("record the controller: %v", err)
		}
		if r, ok, err := s.ControllerRecord(ctx); err != nil || !ok || r.By != "admin" {
			t.Fatalf("the controller record: %+v, %v, %v", r, ok, err)
		}
		rep, err := reconciler.Run(ctx, s.Inventory(), true)
		if err != nil || !rep.Healthy || rep.Permits != 3 {
			t.Fatalf("reconcile: %+v, %v", rep, err)
		}
		st, err := s.Status(ctx)
		if err != nil || !st.Healthy || st.Available != 3 {
			t.Fatalf("status after the resize: %+v, %v", st, err)
		}
	})

	t.Run("operator", func(t *testing.T) {
		infos, err := amqpsem.List(ctx, operator)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, in := range infos {
			got = append(got, fmt.Sprintf("%s:%s:%d", in.Name, in.State, in.Permits))
		}
		if want := []string{a + ":ready:3", b + ":ready:1"}; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("list = %v, want %v", got, want)
		}
	})

	// An operator without write on the registry's exchange cannot
	// publish the end marker of its read: it still lists, and is told
	// what to grant.
	t.Run("operator without write on the registry exchange", func(t *testing.T) {
		p := amqpsem.OperatorPermissions()
		p.Write = `^tokensem\.\.registry$`
		var log semtest.SyncBuffer
		old := dialURL(t, rightsUser(t, vhost, p), amqpsem.WithDialLogger(slog.New(slog.NewTextHandler(&log, nil))))
		infos, err := amqpsem.List(ctx, old)
		if err != nil {
			t.Fatal(err)
		}
		if len(infos) != 2 {
			t.Errorf("list = %+v, want %s and %s", infos, a, b)
		}
		if !strings.Contains(log.String(), "grant write on the exchange tokensem..registry.x") {
			t.Errorf("the list did not say which right its end marker needs; its log:\n%s", log.String())
		}
	})

	t.Run("refused on another semaphore", func(t *testing.T) {
		cfgB, lockB, tokensB := "queue 'tokensem."+b+".cfg'", "queue 'tokensem."+b+".lock'", "queue 'tokensem."+b+"'"
		type op struct {
			name           string
			run            func(context.Context) error
			perm, resource string
		}
		open := func(c *amqpsem.Conn) func(context.Context) error {
			return func(ctx context.Context) error { _, err := amqpsem.Open(ctx, c, b); return err }
		}
		initB := func(c *amqpsem.Conn) func(context.Context) error {
			return func(ctx context.Context) error { _, err := amqpsem.Init(ctx, c, b, 1); return err }
		}
		del := func(c *amqpsem.Conn, force bool) func(context.Context) error {
			if force {
				return func(ctx context.Context) error { return amqpsem.ForceDelete(ctx, c, b) }
			}
			return func(ctx context.Context) error { return amqpsem.Delete(ctx, c, b) }
		}
		// The operator may read B's configuration (to list it), so it
		// opens B; every use of the semaphore is refused.
		ob, err := amqpsem.Open(ctx, operator, b, amqpsem.WithOrphanRepair(0))
		if err != nil {
			t.Fatalf("operator's open of B: %v", err)
		}
		defer ob.Close()
		ops := []op{
			{"client open (acquire, status)", open(clientA), "read", cfgB},
			{"client init", initB(clientA), "configure", lockB},
			{"admin open (acquire, status, resize, reconcile)", open(adminA), "read", cfgB},
			{"admin init", initB(adminA), "configure", lockB},
			{"admin delete", del(adminA, false), "configure", lockB},
			{"admin force delete", del(adminA, true), "configure", lockB},
			{"operator acquire", func(ctx context.Context) error { _, err := ob.Acquire(ctx); return err }, "read", tokensB},
			{"operator try acquire", func(ctx context.Context) error { _, err := ob.TryAcquire(ctx); return err }, "read", tokensB},
			{"operator status", func(ctx context.Context) error { _, err := ob.Status(ctx); return err }, "read", tokensB},
			{"operator resize", func(ctx context.Context) error { _, err := ob.Resize(ctx, 5); return err }, "configure", lockB},
			{"operator reconcile", func(ctx context.Context) error { _, err := reconciler.Run(ctx, ob.Inventory(), true); return err }, "configure", lockB},
			{"operator init", initB(operator), "configure", lockB},
			{"operator delete", del(operator, false), "configure", lockB},
		}
		for _, o := range ops {
			start := time.Now()
			err := o.run(ctx)
			wantDenied(t, o.name, err, time.Since(start), o.perm, o.resource)
		}
	})

	t.Run("admin of A cannot write into B", func(t *testing.T) {
		adminURL := rightsUser(t, vhost, amqpsem.AdminPermissions(a))
		forged := []byte(`{"v":1,"seq":9,"state":"ready","permits":10,"epoch":1,"queue_type":"quorum"}`)
		for _, tc := range []struct {
			name     string
			do       func(ch *amqp.Channel) error
			resource string
		}{
			{"config through the default exchange", publishTo("", "tokensem."+b+".cfg", forged), "exchange 'amq.default'"},
			{"token through the default exchange", publishTo("", "tokensem."+b, []byte("junk")), "exchange 'amq.default'"},
			{"config through B's exchange", publishTo("tokensem."+b+".x", "tokensem."+b+".cfg", forged), "exchange 'tokensem." + b + ".x'"},
			{"bind B's config queue to A's exchange", func(ch *amqp.Channel) error {
				return ch.QueueBind("tokensem."+b+".cfg", "x", "tokensem."+a+".x", false, nil)
			}, "queue 'tokensem." + b + ".cfg'"},
			{"purge B's tokens", func(ch *amqp.Channel) error { _, err := ch.QueuePurge("tokensem."+b, false); return err }, "queue 'tokensem." + b + "'"},
		} {
			err := rawDoErr(t, adminURL, tc.do)
			var ae *amqp.Error
			if !errors.As(err, &ae) || ae.Code != amqp.AccessRefused || !strings.Contains(ae.Reason, tc.resource) {
				t.Errorf("%s: %v, want 403 on %s", tc.name, err, tc.resource)
			}
		}
		st, err := sb.Status(ctx)
		if err != nil || !st.Healthy || st.Permits != 1 || st.Available != 1 {
			t.Errorf("B after the attempts: %+v, %v", st, err)
		}
	})

	t.Run("admin deletes", func(t *testing.T) {
		if err := amqpsem.Delete(ctx, adminA, a); err != nil {
			t.Fatalf("delete: %v", err)
		}
		if _, err := amqpsem.Init(ctx, adminA, a, 1); err != nil {
			t.Fatalf("init after the delete: %v", err)
		}
		if err := amqpsem.ForceDelete(ctx, adminA, a); err != nil {
			t.Fatalf("force delete: %v", err)
		}
		if _, err := amqpsem.Open(ctx, guest, a); !errors.Is(err, tokensem.ErrNotInitialized) {
			t.Fatalf("open after the deletes: %v, want ErrNotInitialized", err)
		}
	})
}

// publishTo returns a step that publishes body to exchange x with key k,
// in confirm mode, and returns the broker's refusal if any.
func publishTo(x, k string, body []byte) func(ch *amqp.Channel) error {
	return func(ch *amqp.Channel) error {
		if err := ch.Confirm(false); err != nil {
			return err
		}
		dc, err := ch.PublishWithDeferredConfirm(x, k, false, false, amqp.Publishing{DeliveryMode: amqp.Persistent, Body: body})
		if err != nil {
			return err
		}
		if !dc.Wait() {
			return errors.New("nacked")
		}
		return nil
	}
}

// rawDoErr runs do on a channel of its own connection as u, and returns
// its error or, when the broker closed the channel, the broker's reason.
func rawDoErr(t testing.TB, u string, do func(*amqp.Channel) error) error {
	t.Helper()
	conn, err := amqp.Dial(u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	closes := ch.NotifyClose(make(chan *amqp.Error, 1))
	err = do(ch)
	if e, ok := <-closesNow(closes); ok && e != nil {
		return e
	}
	_ = ch.Close()
	return err
}

func closesNow(c chan *amqp.Error) chan *amqp.Error {
	out := make(chan *amqp.Error, 1)
	select {
	case e := <-c:
		out <- e
	case <-time.After(200 * time.Millisecond):
		close(out)
	}
	return out
}

func rawDo(t testing.TB, u string, do func(*amqp.Channel) error) {
	t.Helper()
	if err := rawDoErr(t, u, do); err != nil {
		t.Fatal(err)
	}
}

// TestExtraConfigRecordRefused: a configuration queue holding a second
// record, published by another user allowed to write to the semaphore's
// exchange, is refused and reported, never read: Open, Status, Acquire
// and Resize fail with ErrInvalidRecord, List lists it as invalid, and
// ForceDelete removes it. (Before, readers took the first message, and a
// record published before a resize's write outlived it: the 10
// holders of 3 permits.)
func TestExtraConfigRecordRefused(t *testing.T) {
	t.Parallel()
	vhost, guestURL := rightsVhost(t)
	n := "forged"
	ctx := semtest.Context(t, 2*time.Minute)
	guest := dialURL(t, guestURL)
	s, err := amqpsem.Init(ctx, guest, n, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	forger := rightsUser(t, vhost, amqpsem.Permissions{Configure: "^$", Write: `^tokensem\.` + n + `\.x$`, Read: "^$"})
	var real []byte
	rawDo(t, guestURL, func(ch *amqp.Channel) error {
		d, ok, err := ch.Get("tokensem."+n+".cfg", false)
		if err != nil || !ok {
			return fmt.Errorf("read the configuration: %v (found %v)", err, ok)
		}
		real = d.Body
		return nil // the close requeues it
	})
	forged := semtest.EditJSON(t, real, "permits", 10)
	for _, body := range [][]byte{forged, real} { // a copy of the real one is refused too
		rawDo(t, forger, publishTo("tokensem."+n+".x", "tokensem."+n+".cfg", body))
		start := time.Now()
		_, err := amqpsem.Open(ctx, guest, n)
		if !errors.Is(err, tokensem.ErrInvalidRecord) || !strings.Contains(err.Error(), "more than one message") {
			t.Fatalf("open with a second record: %v, want ErrInvalidRecord", err)
		}
		if took := time.Since(start); took > tokensem.DefaultRequestTimeout {
			t.Errorf("open took %v: retried", took)
		}
		time.Sleep(2100 * time.Millisecond) // the open handle's configuration is stale
		if _, err := s.Status(ctx); !errors.Is(err, tokensem.ErrInvalidRecord) {
			t.Errorf("status: %v, want ErrInvalidRecord", err)
		}
		if _, err := s.Acquire(ctx); !errors.Is(err, tokensem.ErrInvalidRecord) {
			t.Errorf("acquire: %v, want ErrInvalidRecord", err)
		}
		if _, err := s.Resize(ctx, 3); !errors.Is(err, tokensem.ErrInvalidRecord) {
			t.Errorf("resize: %v, want ErrInvalidRecord", err)
		}
		infos, err := amqpsem.List(ctx, guest)
		if err != nil || len(infos) != 1 || infos[0].State != "invalid" || !strings.Contains(infos[0].Warning, "more than one message") {
			t.Errorf("list: %+v, %v; want %s invalid", infos, err, n)
		}
		if err := amqpsem.ForceDelete(ctx, guest, n); err != nil {
			t.Fatalf("force delete: %v", err)
		}
		if s, err = amqpsem.Init(ctx, guest, n, 2); err != nil {
			t.Fatalf("init after the force delete: %v", err)
		}
		defer s.Close()
	}
}

// TestClaimSquatting: a client of a semaphore that holds the exclusive
// consumers of its slots' claim queues, with no token, keeps every
// acquirer out while the tokens lie ready. Status reports it unhealthy,
// saying so, and a repair refuses (ErrClaimsSquatted) instead of taking
// the ready tokens for duplicates of held slots and removing them; once
// the squatter goes, the semaphore is whole.
func TestClaimSquatting(t *testing.T) {
	t.Parallel()
	vhost, guestURL := rightsVhost(t)
	n := "squat"
	ctx := semtest.Context(t, 2*time.Minute)
	s, err := amqpsem.Init(ctx, dialURL(t, guestURL), n, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	squatter, err := amqp.Dial(rightsUser(t, vhost, amqpsem.ClientPermissions(n)))
	if err != nil {
		t.Fatal(err)
	}
	defer squatter.Close()
	ch, err := squatter.Channel()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if _, err := ch.Consume(fmt.Sprintf("tokensem.%s.claim.%d", n, i), "", false, true, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	st, err := s.Status(ctx)
	if err != nil || st.Healthy || !strings.Contains(strings.Join(st.Warnings, "\n"), "held by connections that hold no token") {
		t.Errorf("status while squatted: %+v, %v; want unhealthy, saying why", st, err)
	}
	if _, err := reconciler.Run(ctx, s.Inventory(), true); !errors.Is(err, amqpsem.ErrClaimsSquatted) {
		t.Errorf("repair while squatted: %v, want ErrClaimsSquatted", err)
	}
	_ = squatter.Close()
	for {
		st, err = s.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Held == 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !st.Healthy || st.Available != 2 {
		t.Errorf("status once the squatter left: %+v", st)
	}
}

// TestPermissionsDoc: docs/permissions-rabbitmq.md gives each role's
// permissions as these functions return them.
func TestPermissionsDoc(t *testing.T) {
	doc, err := os.ReadFile("../docs/permissions-rabbitmq.md")
	if err != nil {
		t.Fatal(err)
	}
	for role, p := range map[string]amqpsem.Permissions{
		"client":   amqpsem.ClientPermissions("A"),
		"admin":    amqpsem.AdminPermissions("A"),
		"operator": amqpsem.OperatorPermissions(),
	} {
		want := fmt.Sprintf("USER \\\n  '%s' \\\n  '%s' \\\n  '%s'\n", p.Configure, p.Write, p.Read)
		if !strings.Contains(string(doc), want) {
			t.Errorf("the doc does not give the %s's permissions as\n%s", role, want)
		}
	}
}

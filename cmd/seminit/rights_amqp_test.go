package main

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem/amqpsem"
)

// rabbitctl runs rabbitmqctl (as root, on the broker's host), failing the
// test if it fails.
func rabbitctl(t testing.TB, args ...string) {
	t.Helper()
	out, err := exec.Command("rabbitmqctl", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("rabbitmqctl %q: %v\n%s", args, err, out)
	}
}

// rightsSetup makes a vhost of the test's own (deleted by a cleanup) and
// returns a function that makes users with given permissions there
// (deleted by a cleanup too) and returns their URLs; nil permissions make
// guest's, who may do anything.
func rightsSetup(t *testing.T, b broker) func(p *amqpsem.Permissions) string {
	t.Helper()
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and no rabbitmqctl: %v", err)
		}
		t.Skipf("no rabbitmqctl: %v", err)
	}
	vhost := "amqp-rights-" + runID + fmt.Sprint(nameSeq.Add(1))
	rabbitctl(t, "add_vhost", vhost)
	t.Cleanup(func() { rabbitctl(t, "delete_vhost", vhost) })
	return func(p *amqpsem.Permissions) string {
		user, pass := "guest", "guest"
		if p == nil {
			p = &amqpsem.Permissions{Configure: ".*", Write: ".*", Read: ".*"}
		} else {
			user, pass = fmt.Sprintf("amqp-rights-%s-%d", runID, nameSeq.Add(1)), fmt.Sprintf("pw%x", time.Now().UnixNano())
			rabbitctl(t, "add_user", user, pass)
			t.Cleanup(func() { rabbitctl(t, "delete_user", user) })
		}
		rabbitctl(t, "set_permissions", "-p", vhost, user, p.Configure, p.Write, p.Read)
		u, err := url.Parse(b.url)
		if err != nil {
			t.Fatal(err)
		}
		u.User = url.UserPassword(user, pass)
		u.Path = "/" + vhost
		return u.String()
	}
}

// TestRightsAMQP runs seminit as RabbitMQ users with exactly the
// permissions docs/permissions-rabbitmq.md gives a client of a semaphore,
// an admin of it, and an operator: each does its work, and each verb on
// another semaphore exits 77 at once, naming the permission refused. The
// admin of one semaphore cannot publish configuration records or tokens
// into another's queues (issue 33).
func TestRightsAMQP(t *testing.T) {
	t.Parallel()
	b := amqpBroker(t)
	user := rightsSetup(t, b)
	a, other := "sem", "sem-b" // other's name starts with a's
	guest := user(nil)
	op, admin, client := amqpsem.OperatorPermissions(), amqpsem.AdminPermissions(a), amqpsem.ClientPermissions(a)
	operatorURL, adminURL, clientURL := user(&op), user(&admin), user(&client)
	run := func(u string, args ...string) result {
		t.Helper()
		return startSeminit(t, b.env("TOKENSEM_URL="+u), args...).wait(60 * time.Second)
	}
	must := func(u string, args ...string) result {
		t.Helper()
		r := run(u, args...)
		if r.code != exitOK {
			t.Fatalf("seminit %q: %v", args, r)
		}
		return r
	}

	must(operatorURL, "list") // sets the registry up
	must(adminURL, "init", "--name", a, "--permits", "2")
	must(guest, "init", "--name", other, "--permits", "1")

	t.Run("client", func(t *testing.T) {
		must(clientURL, "status", "--name", a)
		must(clientURL, "status", "--name", a, "--count")
		must(clientURL, "exec", "--name", a, "--wait", "10s", "--", "true")
		must(clientURL, "exec", "--name", a, "--weight", "2", "--wait", "10s", "--", "true")
	})
	t.Run("admin", func(t *testing.T) {
		must(adminURL, "resize", "--name", a, "--permits", "3")
		if r := must(adminURL, "reconcile", "--name", a, "--repair", "--json"); !strings.Contains(r.stdout, `"healthy": true`) {
			t.Errorf("reconcile: %v", r)
		}
		if r := must(adminURL, "status", "--name", a, "--json"); !strings.Contains(r.stdout, `"permits": 3,`) {
			t.Errorf("status after the resize: %v", r)
		}
	})
	t.Run("operator", func(t *testing.T) {
		r := must(operatorURL, "list")
		if !strings.Contains(r.stdout, a) || !strings.Contains(r.stdout, other) {
			t.Errorf("list: %v", r)
		}
	})

	t.Run("refused on another semaphore", func(t *testing.T) {
		cfg, lock, tokens := "queue 'tokensem."+other+".cfg'", "queue 'tokensem."+other+".lock'", "queue 'tokensem."+other+"'"
		cases := []struct {
			role, u        string
			args           []string
			perm, resource string
		}{
			{"client", clientURL, []string{"status", "--name", other}, "read", cfg},
			{"client", clientURL, []string{"exec", "--name", other, "--wait", "30s", "--", "true"}, "read", cfg},
			{"client", clientURL, []string{"init", "--name", other, "--permits", "1"}, "configure", lock},
			{"admin", adminURL, []string{"status", "--name", other}, "read", cfg},
			{"admin", adminURL, []string{"exec", "--name", other, "--wait", "30s", "--", "true"}, "read", cfg},
			{"admin", adminURL, []string{"init", "--name", other, "--permits", "5"}, "configure", lock},
			{"admin", adminURL, []string{"resize", "--name", other, "--permits", "5"}, "read", cfg},
			{"admin", adminURL, []string{"reconcile", "--name", other, "--repair"}, "read", cfg},
			{"admin", adminURL, []string{"delete", "--name", other}, "configure", lock},
			{"admin", adminURL, []string{"delete", "--name", other, "--force"}, "configure", lock},
			{"operator", operatorURL, []string{"status", "--name", other}, "read", tokens},
			{"operator", operatorURL, []string{"exec", "--name", other, "--wait", "30s", "--", "true"}, "read", tokens},
			{"operator", operatorURL, []string{"resize", "--name", other, "--permits", "5"}, "configure", lock},
			{"operator", operatorURL, []string{"reconcile", "--name", other, "--repair"}, "configure", lock},
			{"operator", operatorURL, []string{"init", "--name", other, "--permits", "5"}, "configure", lock},
			{"operator", operatorURL, []string{"delete", "--name", other, "--force"}, "configure", lock},
		}
		procs := make([]*proc, len(cases))
		for i, tc := range cases {
			procs[i] = startSeminit(t, b.env("TOKENSEM_URL="+tc.u), tc.args...)
		}
		for i, tc := range cases {
			r := procs[i].wait(60 * time.Second)
			t.Run(tc.role+" "+tc.args[0]+" "+strings.Join(tc.args[3:min(len(tc.args), 4)], ""), func(t *testing.T) {
				want := tc.perm + " permission on " + tc.resource
				switch {
				case r.code != exitNoAuth:
					t.Errorf("seminit %q: %v\nwant exit %d", tc.args, r, exitNoAuth)
				case !strings.Contains(r.stderr, want):
					t.Errorf("stderr = %q, want it to name %q", r.stderr, want)
				case r.elapsed > 10*time.Second: // the round-trip timeout: no retries
					t.Errorf("refused after %v", r.elapsed)
				}
			})
		}
	})

	t.Run("admin cannot write into another semaphore", func(t *testing.T) {
		forged := []byte(`{"v":1,"seq":9,"state":"ready","permits":10,"epoch":1,"queue_type":"quorum"}`)
		for _, tc := range []struct{ exchange, queue string }{
			{"", "tokensem." + other + ".cfg"},
			{"", "tokensem." + other},
			{"tokensem." + other + ".x", "tokensem." + other + ".cfg"},
			{"tokensem." + other + ".x", "tokensem." + other},
			{"tokensem." + a + ".x", "tokensem." + other + ".cfg"}, // no binding reaches it
		} {
			err := rawPublish(t, adminURL, tc.exchange, tc.queue, forged)
			if tc.exchange == "tokensem."+a+".x" {
				if !errors.Is(err, errReturned) {
					t.Errorf("publish through the admin's own exchange to %s: %v, want it returned unroutable", tc.queue, err)
				}
				continue
			}
			var ae *amqp.Error
			if !errors.As(err, &ae) || ae.Code != amqp.AccessRefused {
				t.Errorf("publish to %q with key %s: %v, want 403", tc.exchange, tc.queue, err)
			}
		}
		err := rawDo(t, adminURL, func(ch *amqp.Channel) error {
			return ch.QueueBind("tokensem."+other+".cfg", "k", "tokensem."+a+".x", false, nil)
		})
		var ae *amqp.Error
		if !errors.As(err, &ae) || ae.Code != amqp.AccessRefused {
			t.Errorf("bind the other's configuration queue to the admin's exchange: %v, want 403", err)
		}
		r := must(guest, "status", "--name", other, "--json")
		if !strings.Contains(r.stdout, `"permits": 1,`) || !strings.Contains(r.stdout, `"healthy": true`) {
			t.Errorf("the other semaphore after the attempts: %v", r)
		}
	})

	t.Run("admin deletes", func(t *testing.T) {
		must(adminURL, "delete", "--name", a)
		must(adminURL, "init", "--name", a, "--permits", "1")
		must(adminURL, "delete", "--name", a, "--force")
	})
}

var errReturned = errors.New("returned unroutable")

// rawPublish publishes body to exchange x with routing key k as the user
// of URL u, mandatory and with a confirm, and returns the broker's
// refusal, errReturned, or nil.
func rawPublish(t *testing.T, u, x, k string, body []byte) error {
	return rawDo(t, u, func(ch *amqp.Channel) error {
		returns := ch.NotifyReturn(make(chan amqp.Return, 1))
		if err := ch.Confirm(false); err != nil {
			return err
		}
		dc, err := ch.PublishWithDeferredConfirm(x, k, true, false, amqp.Publishing{DeliveryMode: amqp.Persistent, Body: body})
		if err != nil {
			return err
		}
		if !dc.Wait() {
			return errors.New("nacked")
		}
		select {
		case <-returns:
			return errReturned
		default:
			return nil
		}
	})
}

// rawDo runs do on a channel of its own connection as the user of URL u,
// and returns the broker's reason when it closed the channel, else do's
// error.
func rawDo(t *testing.T, u string, do func(*amqp.Channel) error) error {
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
	select {
	case e := <-closes:
		if e != nil {
			return e
		}
	case <-time.After(200 * time.Millisecond):
	}
	return err
}

package main

// What seminit does with the credentials it is given: its log hides them,
// and exec's command gets them only when asked (--pass-credentials).

import (
	"bytes"
	"errors"
	"log/slog"
	"net/url"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/tokensem/tokensem/internal/freeport"
	"github.com/tokensem/tokensem/internal/testcerts"
	"github.com/tokensem/tokensem/natssem/embedded"
)

// TestLoggerHidesSecrets: the libraries' log (--log-level) hides the
// credentials of the URL and of the flags in messages and attributes.
func TestLoggerHidesSecrets(t *testing.T) {
	tok, pass := "tok-"+runID+"-log", "pw-"+runID+"-log"
	var buf bytes.Buffer
	g := globals{url: "nats://" + tok + "@127.0.0.1:4222", passwordFlag: pass, warn: &buf, logLevel: slog.LevelDebug}
	g.logger().Info("dial nats://"+tok+"@127.0.0.1:4222 failed", "url", g.url,
		"err", errors.New("refused "+pass), "list", []string{"amqp://u:" + pass + "@h/"})
	out := buf.String()
	checkNoSecrets(t, out, []string{tok, pass})
	if !strings.Contains(out, "nats://xxxxx@127.0.0.1:4222") {
		t.Errorf("log %q: want the URL with its token hidden", out)
	}
}

// TestExecChildCredentials: exec's command sees $TOKENSEM_URL without its
// credentials, and none of $TOKENSEM_PASSWORD, $TOKENSEM_TOKEN and
// $TOKENSEM_KEY; --pass-credentials hands them on whole.
func TestExecChildCredentials(t *testing.T) {
	show := []string{"--", "sh", "-c", `echo "url=$TOKENSEM_URL token=$TOKENSEM_TOKEN password=$TOKENSEM_PASSWORD"`}
	t.Run("nats", func(t *testing.T) {
		token := "tok-" + runID + "-child"
		srv, err := embedded.Start(embedded.Config{Options: func(o *server.Options) error {
			o.Authorization = token
			return nil
		}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Shutdown)
		withToken := withUser(t, srv.URL(), token, "")
		b := broker{name: "nats", url: withToken}
		name := uniqueName(t)
		b.mustInit(t, name, 1)
		r := startSeminit(t, b.env(), append([]string{"exec", "--name", name}, show...)...).wait(60 * time.Second)
		if want := "url=" + srv.URL() + " token= password=\n"; r.code != exitOK || r.stdout != want {
			t.Fatalf("exec: %v\nwant stdout %q", r, want)
		}
		// The token from the environment, not the URL.
		r = startSeminit(t, broker{name: "nats", url: srv.URL()}.env("TOKENSEM_TOKEN="+token), append([]string{"exec", "--name", name}, show...)...).wait(60 * time.Second)
		if want := "url=" + srv.URL() + " token= password=\n"; r.code != exitOK || r.stdout != want {
			t.Fatalf("exec, token in the environment: %v\nwant stdout %q", r, want)
		}
		r = startSeminit(t, b.env("TOKENSEM_TOKEN="+token), append([]string{"exec", "--pass-credentials", "--name", name}, show...)...).wait(60 * time.Second)
		if want := "url=" + withToken + " token=" + token + " password=\n"; r.code != exitOK || r.stdout != want {
			t.Fatalf("exec --pass-credentials: %v\nwant stdout %q", r, want)
		}
	})
	t.Run("amqp", func(t *testing.T) {
		b := amqpBroker(t)
		u, err := url.Parse(b.url)
		if err != nil {
			t.Fatal(err)
		}
		pass, ok := u.User.Password()
		if !ok {
			t.Skipf("RabbitMQ URL %s has no password", b.url)
		}
		stripped := *u
		stripped.User = url.User(u.User.Username())
		name := uniqueName(t)
		b.mustInit(t, name, 1)
		r := startSeminit(t, b.env("TOKENSEM_PASSWORD="+pass), append([]string{"exec", "--name", name}, show...)...).wait(60 * time.Second)
		if want := "url=" + stripped.String() + " token= password=\n"; r.code != exitOK || r.stdout != want {
			t.Fatalf("exec: %v\nwant stdout %q", r, want)
		}
		r = startSeminit(t, b.env("TOKENSEM_PASSWORD="+pass), append([]string{"exec", "--pass-credentials", "--name", name}, show...)...).wait(60 * time.Second)
		if want := "url=" + b.url + " token= password=" + pass + "\n"; r.code != exitOK || r.stdout != want {
			t.Fatalf("exec --pass-credentials: %v\nwant stdout %q", r, want)
		}
	})
}

// TestServerOffLoopback: seminit server refuses to take clients without
// credentials, or cluster routes, on an address off loopback unless
// --insecure-no-auth says so, and then warns.
func TestServerOffLoopback(t *testing.T) {
	ports := freeport.Need(t, 4)
	port := func(i int) string { _, p, _ := strings.Cut(ports[i], ":"); return p }
	certs := testcerts.New(t)
	b := broker{name: "nats", url: unreachable}
	const refused = "anyone who can reach it can read, take and delete every semaphore"
	runAuthCases(t, b, nil, []authCase{
		{"every IPv4 address", nil, []string{"server", "--listen", "0.0.0.0:" + port(0)}, exitUsage, "--insecure-no-auth", ""},
		{"every address", nil, []string{"server", "--listen", ":" + port(0)}, exitUsage, refused, ""},
		{"every IPv6 address", nil, []string{"server", "--listen", "[::]:" + port(0)}, exitUsage, refused, ""},
		{"a host name", nil, []string{"server", "--listen", "example.invalid:" + port(0)}, exitUsage, refused, ""},
		{"TLS without client certificates", nil, []string{"server", "--listen", "0.0.0.0:" + port(0), "--tls-cert", certs.ServerCertFile, "--tls-key", certs.ServerKeyFile}, exitUsage, refused, ""},
		{"cluster routes", nil, []string{"server", "--listen", "127.0.0.1:" + port(0), "--user", "alice", "--password", "pw",
			"--server-name", "n1", "--cluster-listen", "0.0.0.0:" + port(1), "--routes", "nats-route://127.0.0.1:" + port(1)}, exitUsage, "routes are not authenticated", ""},
	})

	t.Run("insecure-no-auth", func(t *testing.T) {
		p := startSeminit(t, serverEnv(), "server", "--listen", "0.0.0.0:"+port(2), "--insecure-no-auth")
		if line := p.waitLine(20 * time.Second); !strings.Contains(line, "listening on") {
			t.Fatalf("server said %q", line)
		}
		// The warning comes before the line on stdout, through another
		// pipe: wait for it to be copied.
		eventually(t, 10*time.Second, "a warning about --insecure-no-auth on stderr", func() bool {
			return strings.Contains(p.stderr.String(), "warning: --insecure-no-auth")
		})
		c := broker{name: "nats", url: "nats://127.0.0.1:" + port(2)}
		name := uniqueName(t)
		c.mustInit(t, name, 1)
	})
	t.Run("with a password", func(t *testing.T) {
		p := startSeminit(t, serverEnv("TOKENSEM_PASSWORD=pw-"+runID), "server", "--listen", "0.0.0.0:"+port(3), "--user", "alice")
		if line := p.waitLine(20 * time.Second); !strings.Contains(line, "listening on") {
			t.Fatalf("server said %q", line)
		}
		if s := p.stderr.String(); s != "" {
			t.Errorf("stderr = %q, want no warning", s)
		}
	})
}

// TestPermissionDenied: an operation the broker's permissions refuse ends
// in exit 77 with the refused subject or queue named, not in a timeout's 69;
// nats.go's report of the refusal goes through seminit's log.
func TestPermissionDenied(t *testing.T) {
	t.Parallel()
	t.Run("nats", func(t *testing.T) {
		pass := "pw-" + runID + "-denied"
		srv, err := embedded.Start(embedded.Config{Options: func(o *server.Options) error {
			o.Users = []*server.User{
				{Username: "admin", Password: pass},
				// May connect and receive replies, publish nothing that
				// reaches JetStream.
				{Username: "nobody", Password: pass, Permissions: &server.Permissions{
					Publish:   &server.SubjectPermission{Allow: []string{"nothing.>"}},
					Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
				}},
			}
			return nil
		}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Shutdown)
		b := broker{name: "nats", url: srv.URL()}
		name := uniqueName(t)
		b.mustInit(t, name, 1, "--user", "admin", "--password", pass)
		as := []string{"--user", "nobody", "--password", pass, "--timeout", "1s"}
		runAuthCases(t, b, []string{pass}, []authCase{
			{"status", nil, append([]string{"status", "--name", name}, as...), exitNoAuth, `permission denied: the broker refused to let this user publish to "$JS.API.`, ""},
			{"init", nil, append([]string{"init", "--name", uniqueName(t), "--permits", "1"}, as...), exitNoAuth, "permission denied", ""},
			{"list", nil, append([]string{"list"}, as...), exitNoAuth, "permission denied", ""},
			{"exec", nil, append([]string{"exec", "--name", name}, append(as, "--", "echo", "must not run")...), exitNoAuth, "permission denied", ""},
			{"log", nil, append([]string{"status", "--name", name}, as...), exitNoAuth, `level=WARN msg="nats: the server reported an error"`, ""},
		})
	})
	t.Run("amqp", func(t *testing.T) {
		b := amqpBroker(t)
		user, pass := "cli-secrets-"+runID, "pw-"+runID+"-denied"
		ctl := func(args ...string) {
			t.Helper()
			if out, err := exec.Command("rabbitmqctl", append([]string{"-q"}, args...)...).CombinedOutput(); err != nil {
				t.Fatalf("rabbitmqctl %q: %v\n%s", args, err, out)
			}
		}
		ctl("add_user", user, pass)
		t.Cleanup(func() { ctl("delete_user", user) })
		// May connect to the vhost; may configure, write and read nothing.
		u, err := url.Parse(b.url)
		if err != nil {
			t.Fatal(err)
		}
		vhost := strings.TrimPrefix(u.Path, "/")
		if vhost == "" {
			vhost = "/"
		}
		ctl("set_permissions", "-p", vhost, user, "^$", "^$", "^$")
		name := uniqueName(t)
		b.mustInit(t, name, 1)
		as := []string{"--user", user, "--password", pass, "--timeout", "1s"}
		runAuthCases(t, b, []string{pass}, []authCase{
			{"status", nil, append([]string{"status", "--name", name}, as...), exitNoAuth, "permission denied: read permission on queue", ""},
			{"init", nil, append([]string{"init", "--name", uniqueName(t), "--permits", "1"}, as...), exitNoAuth, "permission denied: configure permission on queue", ""},
			{"list", nil, append([]string{"list"}, as...), exitNoAuth, "permission denied: configure permission on queue 'tokensem..registry.lock'", ""},
		})
	})
}

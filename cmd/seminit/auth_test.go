package main

// Credentials and TLS on both brokers: seminit server with --user/--password
// and --tls-*, in-process NATS servers with token and JWT (creds file)
// authentication, and RabbitMQ behind a TLS-terminating proxy. Every case
// also checks that no secret shows in seminit's output.

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/tokensem/tokensem/internal/freeport"
	"github.com/tokensem/tokensem/internal/testcerts"
	"github.com/tokensem/tokensem/natssem/embedded"
)

// authCase is one seminit run and what it must end in.
type authCase struct {
	name       string
	env        []string // extra environment
	args       []string
	want       int
	wantStderr string // a substring of stderr; "" for none
	wantStdout string // a substring of stdout; "" for none
}

// runAuthCases runs the cases against b in parallel (RabbitMQ answers
// refused credentials after a delay) and checks each one's exit code and
// output, and that none of secrets shows in stdout or stderr.
func runAuthCases(t *testing.T, b broker, secrets []string, cases []authCase) {
	t.Helper()
	procs := make([]*proc, len(cases))
	for i, tc := range cases {
		procs[i] = startSeminit(t, b.env(tc.env...), tc.args...)
	}
	for i, tc := range cases {
		r := procs[i].wait(60 * time.Second)
		t.Run(tc.name, func(t *testing.T) {
			if r.code != tc.want {
				t.Fatalf("seminit %q: %v\nwant exit %d", tc.args, r, tc.want)
			}
			if !strings.Contains(r.stderr, tc.wantStderr) {
				t.Errorf("stderr = %q, want it to contain %q", r.stderr, tc.wantStderr)
			}
			if !strings.Contains(r.stdout, tc.wantStdout) {
				t.Errorf("stdout = %q, want it to contain %q", r.stdout, tc.wantStdout)
			}
			if tc.want != exitOK && r.stdout != "" {
				t.Errorf("stdout = %q, want nothing on failure", r.stdout)
			}
			checkNoSecrets(t, r.stdout+r.stderr, secrets)
			if r.elapsed > 30*time.Second {
				t.Errorf("took %v", r.elapsed)
			}
		})
	}
}

func checkNoSecrets(t testing.TB, out string, secrets []string) {
	t.Helper()
	for _, s := range secrets {
		if s != "" && strings.Contains(out, s) {
			t.Errorf("output shows a secret %q:\n%s", s, out)
		}
	}
}

// startServerVerb runs `seminit server` with args on a free port and
// returns the URL it announces; a cleanup stops it. Its output must not
// show any of secrets.
func startServerVerb(t *testing.T, env []string, secrets []string, args ...string) string {
	t.Helper()
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	p := startSeminit(t, env, append([]string{"server", "--listen", addr}, args...)...)
	line := p.waitLine(20 * time.Second)
	_, rest, ok := strings.Cut(line, "listening on ")
	u, _, _ := strings.Cut(rest, ",")
	if !ok || !strings.HasSuffix(u, addr) {
		t.Fatalf("server announced %q, want a URL for %s", line, addr)
	}
	t.Cleanup(func() { checkNoSecrets(t, p.stdout.String()+p.stderr.String(), secrets) })
	return u
}

// serverEnv is the environment of a seminit server: the test's own,
// without TOKENSEM_* settings.
func serverEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TOKENSEM_") && !strings.HasPrefix(kv, meterChildEnv+"=") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// withUser returns raw with its userinfo set to user and pass (pass "" for
// a user alone).
func withUser(t testing.TB, raw, user, pass string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	if pass == "" {
		u.User = url.User(user)
	} else {
		u.User = url.UserPassword(user, pass)
	}
	return u.String()
}

// TestNATSUserPassword: seminit server --user/--password, and clients with
// the password as a flag, in $TOKENSEM_PASSWORD, or in the URL.
func TestNATSUserPassword(t *testing.T) {
	pass := "pw-" + runID + "-right"
	wrong := "pw-" + runID + "-wrong"
	secrets := []string{pass, wrong}
	// The server takes its password from the environment.
	srvURL := startServerVerb(t, serverEnv("TOKENSEM_PASSWORD="+pass), secrets, "--user", "alice")
	if !strings.HasPrefix(srvURL, "nats://") {
		t.Fatalf("server URL %q, want nats://", srvURL)
	}
	b := broker{name: "nats", url: srvURL, prefix: "TOKENSEM_", leases: true}
	name := uniqueName(t)
	if r := startSeminit(t, b.env(), "init", "--name", name, "--permits", "2", "--user", "alice", "--password", pass).wait(60 * time.Second); r.code != exitOK {
		t.Fatalf("init with the right password: %v", r)
	}
	runAuthCases(t, b, secrets, []authCase{
		{"flag", nil, []string{"status", "--json", "--name", name, "--user", "alice", "--password", pass}, exitOK, "", `"permits": 2`},
		{"env", []string{"TOKENSEM_PASSWORD=" + pass}, []string{"status", "--json", "--name", name, "--user", "alice"}, exitOK, "", `"permits": 2`},
		{"url", nil, []string{"status", "--json", "--name", name, "--url", withUser(t, srvURL, "alice", pass)}, exitOK, "", `"permits": 2`},
		{"url user, env password", []string{"TOKENSEM_PASSWORD=" + pass}, []string{"status", "--json", "--name", name, "--url", withUser(t, srvURL, "alice", "")}, exitOK, "", `"permits": 2`},
		{"flag overrides url", nil, []string{"status", "--json", "--name", name, "--url", withUser(t, srvURL, "alice", wrong), "--password", pass}, exitOK, "", `"permits": 2`},
		{"exec", []string{"TOKENSEM_PASSWORD=" + pass}, []string{"exec", "--name", name, "--user", "alice", "--", "sh", "-c", "echo slot=$TOKENSEM_SLOT"}, exitOK, "", "slot="},
		{"init idempotent", nil, []string{"init", "--name", name, "--permits", "2", "--user", "alice", "--password", pass}, exitOK, "", "permits"},
		{"wrong flag", nil, []string{"status", "--name", name, "--user", "alice", "--password", wrong}, exitNoAuth, "Authorization Violation", ""},
		{"wrong env", []string{"TOKENSEM_PASSWORD=" + wrong}, []string{"status", "--name", name, "--user", "alice"}, exitNoAuth, "Authorization Violation", ""},
		{"wrong url", nil, []string{"status", "--name", name, "--url", withUser(t, srvURL, "alice", wrong)}, exitNoAuth, "Authorization Violation", ""},
		{"wrong user", nil, []string{"status", "--name", name, "--user", "bob", "--password", pass}, exitNoAuth, "Authorization Violation", ""},
		{"none", nil, []string{"status", "--name", name}, exitNoAuth, "Authorization Violation", ""},
		{"wrong init", nil, []string{"init", "--name", uniqueName(t), "--permits", "1", "--user", "alice", "--password", wrong}, exitNoAuth, "Authorization Violation", ""},
		{"wrong exec", nil, []string{"exec", "--name", name, "--user", "alice", "--password", wrong, "--", "echo", "must not run"}, exitNoAuth, "Authorization Violation", ""},
		{"password without user", nil, []string{"status", "--name", name, "--password", pass}, exitUsage, "--password needs a user name", ""},
		{"password and token", nil, []string{"status", "--name", name, "--user", "alice", "--password", pass, "--token", wrong}, exitUsage, "give one kind of credentials", ""},
		{"env token and user", []string{"TOKENSEM_TOKEN=" + wrong}, []string{"status", "--name", name, "--user", "alice", "--password", pass}, exitUsage, "$TOKENSEM_TOKEN", ""},
	})
}

// TestNATSServerFlags covers the usage errors of seminit server's
// credential and TLS flags.
func TestNATSServerFlags(t *testing.T) {
	certs := testcerts.New(t)
	b := broker{name: "nats", url: unreachable}
	runAuthCases(t, b, nil, []authCase{
		{"user without password", nil, []string{"server", "--listen", "127.0.0.1:0", "--user", "alice"}, exitUsage, "--user needs a password", ""},
		{"password without user", nil, []string{"server", "--listen", "127.0.0.1:0", "--password", "x"}, exitUsage, "--password needs --user", ""},
		{"cert without key", nil, []string{"server", "--listen", "127.0.0.1:0", "--tls-cert", certs.ServerCertFile}, exitUsage, "--tls-cert and --tls-key", ""},
		{"ca alone", nil, []string{"server", "--listen", "127.0.0.1:0", "--tls-ca", certs.CAFile}, exitUsage, "--tls-cert and --tls-key", ""},
		{"key not matching", nil, []string{"server", "--listen", "127.0.0.1:0", "--tls-cert", certs.ServerCertFile, "--tls-key", certs.ClientKeyFile}, exitUsage, "--tls-cert/--tls-key", ""},
	})
}

// TestBadURLHidesPassword: a --url that does not parse is a usage error
// whose message does not show the password in it.
func TestBadURLHidesPassword(t *testing.T) {
	secret := "pw-" + runID + "-url"
	b := broker{name: "nats", url: unreachable}
	runAuthCases(t, b, []string{secret}, []authCase{
		{"amqp bad port", nil, []string{"status", "--name", "x", "--url", "amqp://guest:" + secret + "@127.0.0.1:port/"}, exitUsage, "amqp://guest:xxxxx@127.0.0.1:port/", ""},
		{"nats bad port", nil, []string{"status", "--name", "x", "--url", "nats://alice:" + secret + "@127.0.0.1:port"}, exitUsage, "not a broker URL", ""},
	})
}

// TestNATSToken: an in-process server that requires a token.
func TestNATSToken(t *testing.T) {
	token := "tok-" + runID + "-right"
	wrong := "tok-" + runID + "-wrong"
	srv, err := embedded.Start(embedded.Config{Options: func(o *server.Options) error {
		o.Authorization = token
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	b := broker{name: "nats", url: srv.URL()}
	name := uniqueName(t)
	if r := startSeminit(t, b.env("TOKENSEM_TOKEN="+token), "init", "--name", name, "--permits", "3").wait(60 * time.Second); r.code != exitOK {
		t.Fatalf("init with the right token: %v", r)
	}
	runAuthCases(t, b, []string{token, wrong}, []authCase{
		{"flag", nil, []string{"status", "--json", "--name", name, "--token", token}, exitOK, "", `"permits": 3`},
		{"env", []string{"TOKENSEM_TOKEN=" + token}, []string{"status", "--json", "--name", name}, exitOK, "", `"permits": 3`},
		{"url", nil, []string{"status", "--json", "--name", name, "--url", withUser(t, srv.URL(), token, "")}, exitOK, "", `"permits": 3`},
		{"flag overrides env", []string{"TOKENSEM_TOKEN=" + wrong}, []string{"status", "--json", "--name", name, "--token", token}, exitOK, "", `"permits": 3`},
		{"wrong flag", nil, []string{"status", "--name", name, "--token", wrong}, exitNoAuth, "Authorization Violation", ""},
		{"wrong env", []string{"TOKENSEM_TOKEN=" + wrong}, []string{"status", "--name", name}, exitNoAuth, "Authorization Violation", ""},
		{"none", nil, []string{"status", "--name", name}, exitNoAuth, "Authorization Violation", ""},
		// nats.go takes a URL's userinfo without a password as a token:
		// it is a secret, and messages show it as xxxxx.
		{"wrong url", nil, []string{"status", "--name", name, "--url", withUser(t, srv.URL(), wrong, "")}, exitNoAuth, "nats://xxxxx@", ""},
		{"wrong url list", nil, []string{"status", "--name", name, "--url", withUser(t, srv.URL(), wrong, "") + "," + withUser(t, srv.URL(), wrong, "")}, exitNoAuth, "Authorization Violation", ""},
		{"wrong env url", []string{"TOKENSEM_URL=" + withUser(t, srv.URL(), wrong, "")}, []string{"status", "--name", name}, exitNoAuth, "Authorization Violation", ""},
		{"wrong url, debug log", nil, []string{"exec", "--log-level", "debug", "--name", name, "--url", withUser(t, srv.URL(), wrong, ""), "--", "true"}, exitNoAuth, "Authorization Violation", ""},
		{"unreachable url", nil, []string{"status", "--name", name, "--url", withUser(t, unreachable, token, "")}, exitUnavailable, "nats://xxxxx@127.0.0.1:1", ""},
		{"url with a bad port", nil, []string{"status", "--name", name, "--url", "nats://" + token + "@127.0.0.1:port"}, exitUsage, "not a broker URL", ""},
		{"help shows the default url", []string{"TOKENSEM_URL=" + withUser(t, srv.URL(), token, "")}, []string{"status", "--help"}, exitOK, "", "nats://xxxxx@"},
	})
}

// operator is a NATS operator-mode setup: an operator, one account with
// JetStream, and users of that account as creds files.
type operator struct {
	op, acct, sys   nkeys.KeyPair
	claims          *jwt.OperatorClaims
	acctJWT, sysJWT string
}

func newOperator(t *testing.T) *operator {
	t.Helper()
	var o operator
	var err error
	if o.op, err = nkeys.CreateOperator(); err != nil {
		t.Fatal(err)
	}
	opPub, _ := o.op.PublicKey()
	o.claims = jwt.NewOperatorClaims(opPub)
	o.claims.Name = "tokensem-test"
	opJWT, err := o.claims.Encode(o.op)
	if err != nil {
		t.Fatal(err)
	}
	if o.claims, err = jwt.DecodeOperatorClaims(opJWT); err != nil {
		t.Fatal(err)
	}
	// JetStream needs a system account.
	if o.sys, err = nkeys.CreateAccount(); err != nil {
		t.Fatal(err)
	}
	sysPub, _ := o.sys.PublicKey()
	if o.sysJWT, err = jwt.NewAccountClaims(sysPub).Encode(o.op); err != nil {
		t.Fatal(err)
	}
	if o.acct, err = nkeys.CreateAccount(); err != nil {
		t.Fatal(err)
	}
	acctPub, _ := o.acct.PublicKey()
	ac := jwt.NewAccountClaims(acctPub)
	ac.Name = "semaphores"
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	if o.acctJWT, err = ac.Encode(o.op); err != nil {
		t.Fatal(err)
	}
	return &o
}

// start runs an in-process server that trusts the operator and knows its
// account.
func (o *operator) start(t *testing.T) *embedded.Server {
	t.Helper()
	acctPub, _ := o.acct.PublicKey()
	sysPub, _ := o.sys.PublicKey()
	srv, err := embedded.Start(embedded.Config{Options: func(opts *server.Options) error {
		resolver := &server.MemAccResolver{}
		if err := resolver.Store(acctPub, o.acctJWT); err != nil {
			return err
		}
		if err := resolver.Store(sysPub, o.sysJWT); err != nil {
			return err
		}
		opts.TrustedOperators = []*jwt.OperatorClaims{o.claims}
		opts.AccountResolver = resolver
		opts.SystemAccount = sysPub
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return srv
}

// creds writes a creds file for a new user signed by signer (the account,
// or a key the server does not know) and returns its path and seed.
func (o *operator) creds(t *testing.T, signer nkeys.KeyPair, file string) (path, seed string) {
	t.Helper()
	user, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	userPub, _ := user.PublicKey()
	uc := jwt.NewUserClaims(userPub)
	uc.Name = "seminit"
	userJWT, err := uc.Encode(signer)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := user.Seed()
	b, err := jwt.FormatUserConfig(userJWT, s)
	if err != nil {
		t.Fatal(err)
	}
	path = filepath.Join(t.TempDir(), file)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path, string(s)
}

// TestNATSCreds: an operator-mode server; seminit authenticates with a
// creds file (user JWT + seed), as nsc writes them.
func TestNATSCreds(t *testing.T) {
	o := newOperator(t)
	srv := o.start(t)
	b := broker{name: "nats", url: srv.URL()}

	good, goodSeed := o.creds(t, o.acct, "good.creds")
	stranger, err := nkeys.CreateAccount() // an account the server does not know
	if err != nil {
		t.Fatal(err)
	}
	foreign, foreignSeed := o.creds(t, stranger, "foreign.creds")
	dir := t.TempDir()
	junk := filepath.Join(dir, "junk.creds")
	if err := os.WriteFile(junk, []byte("not a creds file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A JWT without its seed: the second half of the file cut off.
	goodBytes, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	noSeed := filepath.Join(dir, "noseed.creds")
	cut := goodBytes[:strings.Index(string(goodBytes), "-----BEGIN USER NKEY SEED-----")]
	if err := os.WriteFile(noSeed, cut, 0o600); err != nil {
		t.Fatal(err)
	}

	name := uniqueName(t)
	if r := startSeminit(t, b.env(), "init", "--name", name, "--permits", "2", "--creds", good).wait(60 * time.Second); r.code != exitOK {
		t.Fatalf("init with the creds file: %v", r)
	}
	runAuthCases(t, b, []string{goodSeed, foreignSeed}, []authCase{
		{"creds", nil, []string{"status", "--json", "--name", name, "--creds", good}, exitOK, "", `"permits": 2`},
		{"exec", nil, []string{"exec", "--name", name, "--creds", good, "--", "true"}, exitOK, "", ""},
		{"none", nil, []string{"status", "--name", name}, exitNoAuth, "Authorization Violation", ""},
		{"unknown account", nil, []string{"status", "--name", name, "--creds", foreign}, exitNoAuth, "Authorization Violation", ""},
		{"missing file", nil, []string{"status", "--name", name, "--creds", filepath.Join(dir, "absent.creds")}, exitUsage, "--creds", ""},
		{"not a creds file", nil, []string{"status", "--name", name, "--creds", junk}, exitUsage, "not a NATS credentials file", ""},
		{"no seed", nil, []string{"status", "--name", name, "--creds", noSeed}, exitUsage, "no user nkey seed", ""},
		{"creds and user", nil, []string{"status", "--name", name, "--creds", good, "--user", "alice"}, exitUsage, "give one kind of credentials", ""},
	})
}

// TestNATSTLS: seminit server --tls-cert/--tls-key, and with --tls-ca also
// requiring client certificates.
func TestNATSTLS(t *testing.T) {
	certs := testcerts.New(t)
	other := testcerts.New(t)
	srvURL := startServerVerb(t, serverEnv(), nil, "--tls-cert", certs.ServerCertFile, "--tls-key", certs.ServerKeyFile)
	if !strings.HasPrefix(srvURL, "tls://") {
		t.Fatalf("TLS server URL %q, want tls://", srvURL)
	}
	natsURL := "nats://" + strings.TrimPrefix(srvURL, "tls://")
	b := broker{name: "nats", url: srvURL}
	name := uniqueName(t)
	if r := startSeminit(t, b.env(), "init", "--name", name, "--permits", "2", "--tls-ca", certs.CAFile).wait(60 * time.Second); r.code != exitOK {
		t.Fatalf("init over TLS: %v", r)
	}
	notPEM := filepath.Join(t.TempDir(), "ca.txt")
	if err := os.WriteFile(notPEM, []byte("no certificate here\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	runAuthCases(t, b, nil, []authCase{
		{"tls:// with CA", nil, []string{"status", "--json", "--name", name, "--tls-ca", certs.CAFile}, exitOK, "", `"permits": 2`},
		{"nats:// with CA", nil, []string{"status", "--json", "--name", name, "--url", natsURL, "--tls-ca", certs.CAFile}, exitOK, "", `"permits": 2`},
		{"client certificate not needed", nil, []string{"status", "--json", "--name", name, "--tls-ca", certs.CAFile, "--tls-cert", certs.ClientCertFile, "--tls-key", certs.ClientKeyFile}, exitOK, "", `"permits": 2`},
		{"insecure", nil, []string{"status", "--json", "--name", name, "--tls-insecure"}, exitOK, "--tls-insecure: the broker's certificate is not verified", `"permits": 2`},
		{"no CA", nil, []string{"status", "--name", name}, exitUnavailable, "certificate signed by unknown authority; the broker's certificate is not signed by a CA seminit trusts: give that CA with --tls-ca FILE", ""},
		{"nats:// no CA", nil, []string{"status", "--name", name, "--url", natsURL}, exitUnavailable, "--tls-ca", ""},
		{"another CA", nil, []string{"status", "--name", name, "--tls-ca", other.CAFile}, exitUnavailable, "unknown authority", ""},
		{"CA file not PEM", nil, []string{"status", "--name", name, "--tls-ca", notPEM}, exitUsage, "no PEM certificate", ""},
		{"CA file missing", nil, []string{"status", "--name", name, "--tls-ca", notPEM + ".absent"}, exitUsage, "--tls-ca", ""},
		{"cert without key", nil, []string{"status", "--name", name, "--tls-ca", certs.CAFile, "--tls-cert", certs.ClientCertFile}, exitUsage, "--tls-cert needs --tls-key", ""},
		{"key without cert", nil, []string{"status", "--name", name, "--tls-ca", certs.CAFile, "--tls-key", certs.ClientKeyFile}, exitUsage, "--tls-key needs --tls-cert", ""},
	})

	t.Run("plaintext server", func(t *testing.T) {
		// The --tls-* flags ask for TLS: a plaintext server is an error.
		runAuthCases(t, natsBroker(), nil, []authCase{
			{"CA", nil, []string{"status", "--name", name, "--tls-ca", certs.CAFile}, exitUnavailable, "secure connection not available", ""},
		})
	})

	t.Run("client certificates required", func(t *testing.T) {
		mtlsURL := startServerVerb(t, serverEnv(), nil, "--tls-cert", certs.ServerCertFile, "--tls-key", certs.ServerKeyFile, "--tls-ca", certs.CAFile)
		m := broker{name: "nats", url: mtlsURL}
		name := uniqueName(t)
		cert := []string{"--tls-ca", certs.CAFile, "--tls-cert", certs.ClientCertFile, "--tls-key", certs.ClientKeyFile}
		if r := startSeminit(t, m.env(), append([]string{"init", "--name", name, "--permits", "1"}, cert...)...).wait(60 * time.Second); r.code != exitOK {
			t.Fatalf("init with a client certificate: %v", r)
		}
		runAuthCases(t, m, nil, []authCase{
			{"client certificate", nil, append([]string{"status", "--json", "--name", name}, cert...), exitOK, "", `"permits": 1`},
			{"no client certificate", nil, []string{"status", "--name", name, "--tls-ca", certs.CAFile}, exitUnavailable, "client certificate", ""},
			{"client certificate of another CA", nil, []string{"status", "--name", name, "--tls-ca", certs.CAFile, "--tls-cert", other.ClientCertFile, "--tls-key", other.ClientKeyFile}, exitUnavailable, "client certificate", ""},
		})
	})

	t.Run("with a password", func(t *testing.T) {
		pass := "pw-" + runID + "-tls"
		u := startServerVerb(t, serverEnv(), []string{pass}, "--tls-cert", certs.ServerCertFile, "--tls-key", certs.ServerKeyFile, "--user", "alice", "--password", pass)
		m := broker{name: "nats", url: u}
		name := uniqueName(t)
		runAuthCases(t, m, []string{pass}, []authCase{
			{"init", []string{"TOKENSEM_PASSWORD=" + pass}, []string{"init", "--name", name, "--permits", "1", "--user", "alice", "--tls-ca", certs.CAFile}, exitOK, "", "permits"},
			{"wrong password", []string{"TOKENSEM_PASSWORD=" + pass + "x"}, []string{"status", "--name", name, "--user", "alice", "--tls-ca", certs.CAFile}, exitNoAuth, "Authorization Violation", ""},
		})
	})
}

// amqpsURL returns the RabbitMQ URL raw as amqps:// to addr.
func amqpsURL(t testing.TB, raw, addr string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	u.Scheme, u.Host = "amqps", addr
	return u.String()
}

// TestAMQPCredentials: --user/--password against RabbitMQ override the
// URL's userinfo; NATS-only credentials are usage errors.
func TestAMQPCredentials(t *testing.T) {
	t.Parallel()
	rabbit := amqpBroker(t)
	u, err := url.Parse(rabbit.url)
	if err != nil {
		t.Fatal(err)
	}
	user := u.User.Username()
	pass, _ := u.User.Password()
	if user == "" {
		user, pass = "guest", "guest"
	}
	wrong := "pw-" + runID + "-wrong"
	name := uniqueName(t)
	rabbit.mustInit(t, name, 2)
	// The URL's credentials are wrong; the flags (or the environment) put
	// the right ones in.
	badURL := withUser(t, rabbit.url, user, wrong)
	runAuthCases(t, rabbit, []string{wrong}, []authCase{
		{"flags override url", nil, []string{"status", "--json", "--name", name, "--url", badURL, "--user", user, "--password", pass}, exitOK, "", `"permits": 2`},
		{"env overrides url", []string{"TOKENSEM_PASSWORD=" + pass}, []string{"status", "--json", "--name", name, "--url", badURL}, exitOK, "", `"permits": 2`},
		{"wrong password flag", nil, []string{"status", "--name", name, "--user", user, "--password", wrong}, exitNoAuth, "credentials refused", ""},
		{"wrong password env", []string{"TOKENSEM_PASSWORD=" + wrong}, []string{"status", "--name", name, "--user", user}, exitNoAuth, "credentials refused", ""},
		{"wrong user", nil, []string{"exec", "--name", name, "--user", "nobody-" + runID, "--password", wrong, "--", "echo", "must not run"}, exitNoAuth, "credentials refused", ""},
		{"token", nil, []string{"status", "--name", name, "--token", wrong}, exitUsage, "--token applies to nats:// only", ""},
		{"env token", []string{"TOKENSEM_TOKEN=" + wrong}, []string{"status", "--name", name}, exitUsage, "$TOKENSEM_TOKEN applies to nats:// only", ""},
		{"creds", nil, []string{"status", "--name", name, "--creds", "/dev/null"}, exitUsage, "--creds applies to nats:// only", ""},
		{"tls on amqp://", nil, []string{"status", "--name", name, "--tls-insecure"}, exitUsage, "need an amqps:// URL", ""},
	})
}

// TestAMQPTLS: seminit over amqps:// to RabbitMQ behind a TLS-terminating
// proxy with a test CA's certificate.
func TestAMQPTLS(t *testing.T) {
	t.Parallel()
	rabbit := amqpBroker(t)
	certs := testcerts.New(t)
	other := testcerts.New(t)
	proxy := testcerts.StartProxy(t, certs.ServerConfig(false), rabbitAddr(t, rabbit.url))
	mtls := testcerts.StartProxy(t, certs.ServerConfig(true), rabbitAddr(t, rabbit.url))
	b := broker{name: "amqp", url: amqpsURL(t, rabbit.url, proxy.Addr), prefix: "tokensem."}
	name := uniqueName(t)
	b.mustInit(t, name, 2, "--tls-ca", certs.CAFile)
	cert := []string{"--tls-ca", certs.CAFile, "--tls-cert", certs.ClientCertFile, "--tls-key", certs.ClientKeyFile}
	wrong := "pw-" + runID + "-wrong"
	runAuthCases(t, b, []string{wrong}, []authCase{
		{"CA", nil, []string{"status", "--json", "--name", name, "--tls-ca", certs.CAFile}, exitOK, "", `"permits": 2`},
		{"exec", nil, []string{"exec", "--name", name, "--tls-ca", certs.CAFile, "--", "sh", "-c", "echo fence=$TOKENSEM_FENCE"}, exitOK, "", "fence="},
		{"insecure", nil, []string{"status", "--json", "--name", name, "--tls-insecure"}, exitOK, "not verified", `"permits": 2`},
		{"mutual TLS", nil, append([]string{"status", "--json", "--name", name, "--url", amqpsURL(t, rabbit.url, mtls.Addr)}, cert...), exitOK, "", `"permits": 2`},
		{"no CA", nil, []string{"status", "--name", name}, exitUnavailable, "TLS handshake failed", ""},
		{"no CA hint", nil, []string{"status", "--name", name}, exitUnavailable, "give that CA with --tls-ca FILE", ""},
		{"another CA", nil, []string{"status", "--name", name, "--tls-ca", other.CAFile}, exitUnavailable, "unknown authority", ""},
		{"no client certificate", nil, []string{"status", "--name", name, "--url", amqpsURL(t, rabbit.url, mtls.Addr), "--tls-ca", certs.CAFile}, exitUnavailable, "client certificate", ""},
		{"plaintext port", nil, []string{"status", "--name", name, "--url", amqpsURL(t, rabbit.url, rabbitAddr(t, rabbit.url)), "--tls-ca", certs.CAFile}, exitUnavailable, "does not speak TLS", ""},
		{"wrong password over TLS", nil, []string{"status", "--name", name, "--tls-ca", certs.CAFile, "--password", wrong}, exitNoAuth, "credentials refused", ""},
	})
}

// rabbitAddr is the host:port of a RabbitMQ URL.
func rabbitAddr(t testing.TB, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	if u.Port() == "" {
		return fmt.Sprintf("%s:5672", u.Hostname())
	}
	return u.Host
}

package main

// The role tests of docs/permissions-nats.md, run through seminit: a NATS
// server whose users have exactly the document's permission blocks; each
// role's verbs work, and every verb on another semaphore, key or group
// exits 77 with the refused subject in stderr. Every refusal runs with
// --timeout 40s: one that waited for a round trip to time out would take
// longer than runAuthCases allows (30 s).

import (
	"strings"
	"testing"
	"time"

	"github.com/tokensem/tokensem/internal/natstest"
)

// rightsBroker starts a server with the users of docs/permissions-nats.md.
func rightsBroker(t *testing.T) broker {
	t.Helper()
	blocks, err := natstest.RoleBlocks("../../docs/permissions-nats.md")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := natstest.StartWithRoles(t.TempDir(), blocks)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return broker{name: "nats", url: srv.URL()}
}

// as returns args run as user, with its own inbox prefix and a round trip
// timeout far longer than a refusal may take.
func as(user string, args ...string) []string {
	return afterVerb(args, "--user", user, "--password", natstest.Password(user),
		"--inbox-prefix", natstest.InboxPrefix(user), "--timeout", "40s")
}

// afterVerb returns args (a verb and its arguments) with flags put after
// the verb, before exec's "--".
func afterVerb(args []string, flags ...string) []string {
	return append(append([]string{args[0]}, flags...), args[1:]...)
}

// mustRun runs seminit with args and fails the test unless it exits 0.
func mustRun(t *testing.T, b broker, args ...string) result {
	t.Helper()
	r := startSeminit(t, b.env(), args...).wait(60 * time.Second)
	if r.code != exitOK {
		t.Fatalf("seminit %q: %v", args, r)
	}
	return r
}

// refusedCase is a verb a role must be refused: exit 77, the subject named.
func refusedCase(name, subject string, args []string) authCase {
	return authCase{name: name, args: args, want: exitNoAuth, wantStderr: subject}
}

func TestNATSRightsLone(t *testing.T) {
	b := rightsBroker(t)
	mustRun(t, b, as(natstest.RootUser, "init", "--name", "B", "--permits", "2", "--lease", "1m")...)
	mustRun(t, b, as(natstest.RootUser, "exec", "--name", "B", "--weight", "2", "--", "true")...) // B's gate

	mustRun(t, b, as("a_admin", "init", "--name", "A", "--permits", "3", "--lease", "1m")...)
	mustRun(t, b, as("a_admin", "resize", "--name", "A", "--permits", "4")...)
	mustRun(t, b, as("a_admin", "reconcile", "--name", "A", "--repair")...)
	mustRun(t, b, as("a_client", "exec", "--name", "A", "--", "true")...)
	mustRun(t, b, as("a_client", "exec", "--name", "A", "--weight", "2", "--", "true")...)
	mustRun(t, b, as("a_client", "status", "--name", "A")...)
	// The inbox prefix from the environment.
	r := startSeminit(t, b.env("TOKENSEM_INBOX_PREFIX="+natstest.InboxPrefix("a_client")),
		"status", "--name", "A", "--user", "a_client", "--password", natstest.Password("a_client")).wait(60 * time.Second)
	if r.code != exitOK {
		t.Fatalf("status with $TOKENSEM_INBOX_PREFIX: %v", r)
	}
	if r := mustRun(t, b, as("operator", "list")...); !containsAll(r.stdout, "A", "B") {
		t.Errorf("list: %v, want A and B", r)
	}

	runAuthCases(t, b, nil, []authCase{
		refusedCase("client status B", `"$JS.API.STREAM.INFO.KV_tokensem_B"`, as("a_client", "status", "--name", "B")),
		refusedCase("client exec B", "tokensem_B", as("a_client", "exec", "--name", "B", "--", "echo", "must not run")),
		refusedCase("client init B", "TOKENSEM_B", as("a_client", "init", "--name", "B", "--permits", "9", "--lease", "1m")),
		refusedCase("client resize B", "tokensem_B", as("a_client", "resize", "--name", "B", "--permits", "9")),
		refusedCase("client reconcile B", "tokensem_B", as("a_client", "reconcile", "--name", "B", "--repair")),
		refusedCase("client delete B", "tokensem_B", as("a_client", "delete", "--name", "B")),
		refusedCase("client delete --force B", "tokensem_B", as("a_client", "delete", "--name", "B", "--force")),
		refusedCase("client list", "$JS.API.STREAM.NAMES", as("a_client", "list")),
		refusedCase("client resize A", "$KV.tokensem_A.", as("a_client", "resize", "--name", "A", "--permits", "9")),
		refusedCase("client delete A", "tokensem_A", as("a_client", "delete", "--name", "A")),
		refusedCase("admin status B", "tokensem_B", as("a_admin", "status", "--name", "B")),
		refusedCase("admin init B", "TOKENSEM_B", as("a_admin", "init", "--name", "B", "--permits", "9", "--lease", "1m")),
		refusedCase("admin resize B", "tokensem_B", as("a_admin", "resize", "--name", "B", "--permits", "9")),
		refusedCase("admin reconcile B", "tokensem_B", as("a_admin", "reconcile", "--name", "B", "--repair")),
		refusedCase("admin delete B", "tokensem_B", as("a_admin", "delete", "--name", "B")),
		refusedCase("admin delete --force B", "tokensem_B", as("a_admin", "delete", "--name", "B", "--force")),
		refusedCase("admin list", "$JS.API.STREAM.NAMES", as("a_admin", "list")),
		refusedCase("operator status A", "tokensem_A", as("operator", "status", "--name", "A")),
		refusedCase("operator init C", "TOKENSEM_C", as("operator", "init", "--name", "C", "--permits", "1", "--lease", "1m")),
		refusedCase("operator delete A", "tokensem_A", as("operator", "delete", "--name", "A")),
		refusedCase("default inbox prefix", "subscribe to \"_INBOX.",
			[]string{"status", "--name", "A", "--user", "a_client", "--password", natstest.Password("a_client"), "--timeout", "40s"}),
	})

	mustRun(t, b, as("a_admin", "delete", "--name", "A")...)
	mustRun(t, b, as("a_admin", "init", "--name", "A", "--permits", "2", "--lease", "1m")...)
	mustRun(t, b, as("a_admin", "delete", "--name", "A", "--force")...)
}

func TestNATSRightsGroup(t *testing.T) {
	b := rightsBroker(t)
	for _, g := range []string{"G", "G2"} {
		mustRun(t, b, as(natstest.RootUser, "init", "--group", g, "--name", "k2", "--permits", "2", "--lease", "1m")...)
	}
	in := func(args ...string) []string { return afterVerb(args, "--group", "G") }

	mustRun(t, b, as("k1_admin", in("init", "--name", "k1", "--permits", "3", "--lease", "1m")...)...)
	mustRun(t, b, as("k1_admin", in("resize", "--name", "k1", "--permits", "4")...)...)
	mustRun(t, b, as("k1_admin", in("reconcile", "--name", "k1", "--repair")...)...)
	mustRun(t, b, as("k1_client", in("exec", "--name", "k1", "--", "true")...)...)
	mustRun(t, b, as("k1_client", in("exec", "--name", "k1", "--weight", "2", "--", "true")...)...)
	mustRun(t, b, as("k1_client", in("status", "--name", "k1")...)...)
	if r := mustRun(t, b, as("g_operator", in("list")...)...); !containsAll(r.stdout, "k1", "k2") {
		t.Errorf("list --group G: %v, want k1 and k2", r)
	}

	runAuthCases(t, b, nil, []authCase{
		refusedCase("client status k2", "holders_k2", as("k1_client", in("status", "--name", "k2")...)),
		refusedCase("client exec k2", "holders_k2", as("k1_client", in("exec", "--name", "k2", "--", "echo", "must not run")...)),
		refusedCase("client init k2", "k2", as("k1_client", in("init", "--name", "k2", "--permits", "9", "--lease", "1m")...)),
		refusedCase("client resize k2", "k2", as("k1_client", in("resize", "--name", "k2", "--permits", "9")...)),
		refusedCase("client delete k2", "k2", as("k1_client", in("delete", "--name", "k2")...)),
		refusedCase("client status k1 of G2", "G2", as("k1_client", "status", "--group", "G2", "--name", "k1")),
		refusedCase("client list G", "KV_tokensemg_G", as("k1_client", in("list")...)),
		refusedCase("admin status k2", "holders_k2", as("k1_admin", in("status", "--name", "k2")...)),
		refusedCase("admin init k2", "k2", as("k1_admin", in("init", "--name", "k2", "--permits", "9", "--lease", "1m")...)),
		refusedCase("admin resize k2", "k2", as("k1_admin", in("resize", "--name", "k2", "--permits", "9")...)),
		refusedCase("admin reconcile k2", "k2", as("k1_admin", in("reconcile", "--name", "k2", "--repair")...)),
		refusedCase("admin delete k2", "k2", as("k1_admin", in("delete", "--name", "k2")...)),
		refusedCase("admin delete --force k2", "k2", as("k1_admin", in("delete", "--name", "k2", "--force")...)),
		refusedCase("admin init k1 of G2", "G2", as("k1_admin", "init", "--group", "G2", "--name", "k1", "--permits", "1", "--lease", "1m")),
		refusedCase("admin list", "$JS.API.STREAM.NAMES", as("k1_admin", "list")),
		refusedCase("operator status k1", "TOKENSEMG_G", as("g_operator", in("status", "--name", "k1")...)),
		refusedCase("operator list G2", "G2", as("g_operator", "list", "--group", "G2")),
	})

	mustRun(t, b, as("k1_admin", in("delete", "--name", "k1")...)...)
	mustRun(t, b, as("k1_admin", in("init", "--name", "k1", "--permits", "2", "--lease", "1m")...)...)
	mustRun(t, b, as("k1_admin", in("delete", "--name", "k1", "--force")...)...)
}

// containsAll reports whether every word begins a line of out.
func containsAll(out string, words ...string) bool {
	first := map[string]bool{}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			first[f[0]] = true
		}
	}
	for _, w := range words {
		if !first[w] {
			return false
		}
	}
	return true
}

// TestInboxPrefixUsage: a prefix nats.go would refuse, and the flag on
// RabbitMQ, are usage errors.
func TestInboxPrefixUsage(t *testing.T) {
	b := broker{name: "nats", url: unreachable}
	runAuthCases(t, b, nil, []authCase{
		{"wildcard", nil, []string{"status", "--name", "x", "--inbox-prefix", "_INBOX_a.>"}, exitUsage, "--inbox-prefix", ""},
		{"trailing dot", []string{"TOKENSEM_INBOX_PREFIX=_INBOX_a."}, []string{"status", "--name", "x"}, exitUsage, "--inbox-prefix", ""},
		{"amqp", nil, []string{"status", "--name", "x", "--url", "amqp://127.0.0.1:1/", "--inbox-prefix", "_INBOX_a"}, exitUsage, "nats:// only", ""},
	})
}

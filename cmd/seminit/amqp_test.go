package main

import (
	"net/url"
	"strings"
	"testing"
	"time"
)

// TestAMQPBrokerErrors covers the exit codes of RabbitMQ-specific failures:
// a semaphore that does not exist, the NATS-only init flags, and refused
// credentials (whose password must not show).
func TestAMQPBrokerErrors(t *testing.T) {
	t.Parallel()
	rabbit := amqpBroker(t)
	missing := uniqueName(t)

	password := "wrong-" + runID
	u, err := url.Parse(rabbit.url)
	if err != nil {
		t.Fatal(err)
	}
	user := u.User.Username()
	if user == "" {
		user = "guest"
	}
	u.User = url.UserPassword(user, password)
	wrong := u.String()

	// "Not initialized" is an answer the broker must give in time: with
	// nine of these processes at once on a loaded machine, RabbitMQ took
	// more than the default 5 s to answer a passive declare (one loaded run
	// in 20 exited 69, unavailable: right for a broker that slow). A
	// longer bound on each round trip (--timeout 30s) keeps the cases about
	// their exit codes.
	tests := []struct {
		name       string
		args       []string
		want       int
		wantStderr string
	}{
		{"status not initialized", []string{"status", "--name", missing, "--timeout", "30s"}, exitConfig, "not initialized"},
		{"status --json not initialized", []string{"status", "--json", "--name", missing, "--timeout", "30s"}, exitConfig, "not initialized"},
		{"exec not initialized", []string{"exec", "--name", missing, "--wait", "5s", "--timeout", "30s", "--", "echo", "must not run"}, exitConfig, "not initialized"},
		{"init --lease", []string{"init", "--name", missing, "--permits", "1", "--lease", "2s"}, exitUsage, "--lease applies to nats:// only"},
		{"init --replicas", []string{"init", "--name", missing, "--permits", "1", "--replicas", "3"}, exitUsage, "--replicas applies to nats:// only"},
		{"init wrong password", []string{"init", "--url", wrong, "--name", missing, "--permits", "1"}, exitNoAuth, "credentials refused"},
		{"status wrong password", []string{"status", "--url", wrong, "--name", missing}, exitNoAuth, "credentials refused"},
		{"exec wrong password", []string{"exec", "--url", wrong, "--name", missing, "--", "echo", "must not run"}, exitNoAuth, "credentials refused"},
		// A list whose first node is down: the second answers.
		{"list with a dead node", []string{"status", "--url", "amqp://guest:guest@127.0.0.1:1/," + rabbit.url, "--name", missing, "--timeout", "30s"}, exitConfig, "not initialized"},
	}
	// All at once: RabbitMQ answers refused credentials only after 3s.
	procs := make([]*proc, len(tests))
	for i, tc := range tests {
		procs[i] = startSeminit(t, rabbit.env(), tc.args...)
	}
	for i, tc := range tests {
		r := procs[i].wait(120 * time.Second)
		t.Run(tc.name, func(t *testing.T) {
			if r.code != tc.want {
				t.Fatalf("seminit %q: %v\nwant exit %d", tc.args, r, tc.want)
			}
			if !strings.Contains(r.stderr, tc.wantStderr) {
				t.Errorf("stderr = %q, want it to contain %q", r.stderr, tc.wantStderr)
			}
			if strings.Contains(r.stderr, password) {
				t.Errorf("stderr shows the URL's password: %q", r.stderr)
			}
			if r.stdout != "" {
				t.Errorf("stdout = %q, want nothing on failure", r.stdout)
			}
		})
	}
	// The refused inits must not have created the semaphore.
	if r := rabbit.seminit(t, "status", "--name", missing, "--timeout", "30s"); r.code != exitConfig {
		t.Fatalf("status after the refused inits: %v", r)
	}
}

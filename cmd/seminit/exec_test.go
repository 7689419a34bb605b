package main

import (
	"strings"
	"testing"
)

// TestChildEnv: exec's command does not inherit the broker credentials or
// the signing key seminit read from its environment.
func TestChildEnv(t *testing.T) {
	got := childEnv([]string{"PATH=/bin", "TOKENSEM_PASSWORD=s3cret", "TOKENSEM_TOKEN=t0k", "TOKENSEM_KEY=k3y",
		"TOKENSEM_URL=nats://x", "TOKENSEM_PASSWORDS=kept"})
	want := []string{"PATH=/bin", "TOKENSEM_URL=nats://x", "TOKENSEM_PASSWORDS=kept"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("childEnv = %q, want %q", got, want)
	}
	// The URL names the broker without the credentials in it.
	got = childEnv([]string{"TOKENSEM_URL=amqp://bob:s3cret@h1/,amqp://bob:s3cret@h2/", "X=nats://t0k@h"})
	want = []string{"TOKENSEM_URL=amqp://bob@h1/,amqp://bob@h2/", "X=nats://t0k@h"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("childEnv = %q, want %q", got, want)
	}
}

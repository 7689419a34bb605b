package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/natssem"
)

// TestInvalidConfig: a semaphore whose stored configuration is 100 kB of
// garbage fails alone, with a short message (exit 78): status and init
// say what removes it, list lists it as invalid beside the others and
// exits 0, delete refuses, delete --force removes it, and the name can be
// made again.
func TestInvalidConfig(t *testing.T) {
	t.Parallel()
	forEachBroker(t, testInvalidConfig)
}

func testInvalidConfig(t *testing.T, b broker) {
	bad, good := uniqueName(t), uniqueName(t)+"-ok"
	b.mustInit(t, bad, 2)
	b.mustInit(t, good, 1)
	t.Cleanup(func() {
		// An invalid configuration left on a shared broker would be
		// listed by every run after this one.
		for _, name := range []string{bad, good} {
			if r := b.seminit(t, "delete", "--force", "--name", name); r.code != exitOK && r.code != exitConfig {
				t.Logf("delete --force %s after the test: %v", name, r)
			}
		}
	})
	garbage := []byte(strings.Repeat("\x00garbage\xff", 10<<10))
	b.replaceConfig(t, bad, garbage)

	short := func(what string, r result) {
		t.Helper()
		if len(r.stderr) > 1024 {
			t.Errorf("%s: %d bytes on stderr, want at most 1024 (the record is quoted whole?)", what, len(r.stderr))
		}
	}
	r := b.seminit(t, "status", "--name", bad)
	if r.code != exitConfig || !strings.Contains(r.stderr, "invalid stored record") || !strings.Contains(r.stderr, "delete --force") {
		t.Errorf("status of %s: %.600v\nwant exit %d saying the record is invalid and that delete --force removes it", bad, r, exitConfig)
	}
	short("status", r)

	r = b.seminit(t, "list")
	if r.code != exitOK || !strings.Contains(r.stdout, good) || !strings.Contains(r.stderr, bad) {
		t.Errorf("list: %.600v\nwant exit 0, %s listed, and %s named on stderr", r, good, bad)
	}
	for _, line := range strings.Split(r.stdout, "\n") {
		if strings.HasPrefix(line, bad+" ") && !strings.Contains(line, "invalid") {
			t.Errorf("list shows %s as %q, want state invalid", bad, line)
		}
	}
	// Only this test's line: a shared broker may hold other invalid
	// semaphores, each named on stderr.
	for _, line := range strings.Split(r.stderr, "\n") {
		if strings.Contains(line, bad) && len(line) > 1024 {
			t.Errorf("list: %d bytes on stderr about %s, want at most 1024 (the record is quoted whole?)", len(line), bad)
		}
	}
	r = b.seminit(t, "list", "--json")
	var infos []tokensem.Info
	if err := json.Unmarshal([]byte(r.stdout), &infos); r.code != exitOK || err != nil {
		t.Fatalf("list --json: %v (%v)", r, err)
	}
	states := map[string]string{}
	for _, in := range infos {
		states[in.Name] = in.State
	}
	if states[bad] != "invalid" || states[good] != "ready" {
		t.Errorf("list --json: %s is %q, %s is %q; want invalid and ready", bad, states[bad], good, states[good])
	}

	r = b.seminit(t, "init", "--name", bad, "--permits", "2")
	if r.code != exitConfig || !strings.Contains(r.stderr, "delete --force") {
		t.Errorf("init of %s: %.600v\nwant exit %d naming delete --force", bad, r, exitConfig)
	}
	short("init", r)
	if r := b.seminit(t, "delete", "--name", bad); r.code != exitConfig {
		t.Errorf("delete of %s: %.600v\nwant exit %d", bad, r, exitConfig)
	}
	if r := b.seminit(t, "delete", "--name", bad, "--force"); r.code != exitOK {
		t.Fatalf("delete --force of %s: %.600v", bad, r)
	}
	if r := b.seminit(t, "status", "--name", bad); r.code != exitConfig || !strings.Contains(r.stderr, "not initialized") {
		t.Errorf("status after delete --force: %.600v\nwant exit %d, not initialized", r, exitConfig)
	}
	b.mustInit(t, bad, 3)
	if _, st := b.statusJSON(t, bad); st.Permits != 3 || !st.Healthy {
		t.Errorf("init after delete --force: %+v", st)
	}
}

// replaceConfig replaces the stored configuration of semaphore name with
// data, as a client with write access to it could.
func (b broker) replaceConfig(t *testing.T, name string, data []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if b.name == "nats" {
		nc, err := nats.Connect(b.url)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		kv, err := js.KeyValue(ctx, natssem.ResourcesOf(name, "").Bucket)
		if err == nil {
			_, err = kv.Put(ctx, "config", data)
		}
		if err != nil {
			t.Fatalf("replace the configuration of %s: %v", name, err)
		}
		return
	}
	conn, err := amqp.Dial(b.url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	q := "tokensem." + name + ".cfg"
	if _, err := ch.QueuePurge(q, false); err != nil {
		t.Fatal(err)
	}
	if err := ch.PublishWithContext(ctx, "", q, true, false, amqp.Publishing{DeliveryMode: amqp.Persistent, Body: data}); err != nil {
		t.Fatalf("replace the configuration of %s: %v", name, err)
	}
}

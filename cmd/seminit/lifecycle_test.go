package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/tokensem/tokensem"
)

// TestListDelete: list shows a semaphore; delete refuses (75) while a
// permit is held and changes nothing; delete --force removes it and the
// holder's exec exits 70; the name is then free for another count.
func TestListDelete(t *testing.T) {
	t.Parallel()
	forEachBroker(t, testListDelete)
}

func testListDelete(t *testing.T, b broker) {
	name := uniqueName(t)
	args := []string{}
	if b.leases {
		args = append(args, "--lease", "2s")
	}
	b.mustInit(t, name, 2, args...)
	listed := func() (tokensem.Info, bool) {
		t.Helper()
		r := b.seminit(t, "list", "--json")
		if r.code != exitOK {
			t.Fatalf("list --json: %v", r)
		}
		var infos []tokensem.Info
		if err := json.Unmarshal([]byte(r.stdout), &infos); err != nil {
			t.Fatalf("list --json is not a JSON array of semaphores: %v\n%s", err, r.stdout)
		}
		for _, in := range infos {
			if in.Name == name {
				return in, true
			}
		}
		return tokensem.Info{}, false
	}
	if in, ok := listed(); !ok || in.Permits != 2 || in.State != "ready" || in.Backend != b.name {
		t.Fatalf("list after init: %+v (found %v)", in, ok)
	}
	if r := b.seminit(t, "list"); r.code != exitOK || !strings.Contains(r.stdout, "NAME") || !strings.Contains(r.stdout, name) {
		t.Fatalf("list: %v", r)
	}

	holder, _ := b.holder(t, name, 60)
	r := b.seminit(t, "delete", "--name", name)
	if r.code != exitNoPermit || !strings.Contains(r.stderr, "held") {
		t.Fatalf("delete while a permit is held: %v\nwant exit %d saying it is held", r, exitNoPermit)
	}
	if _, st := b.statusJSON(t, name); st.Held != 1 || st.Permits != 2 || !st.Healthy {
		t.Fatalf("a refused delete changed the semaphore: %+v", st)
	}

	if r := b.seminit(t, "delete", "--name", name, "--force", "--json"); r.code != exitOK || !strings.Contains(r.stdout, `"deleted": true`) {
		t.Fatalf("delete --force: %v", r)
	}
	if hr := holder.wait(20 * time.Second); hr.code != exitSoftware {
		t.Fatalf("the holder of a deleted semaphore: %v\nwant exit %d", hr, exitSoftware)
	}
	if r := b.seminit(t, "status", "--name", name); r.code != exitConfig {
		t.Fatalf("status after delete: %v\nwant exit %d", r, exitConfig)
	}
	if in, ok := listed(); ok {
		t.Fatalf("list after delete still shows %+v", in)
	}
	if r := b.seminit(t, "delete", "--name", name); r.code != exitConfig {
		t.Fatalf("delete of a deleted semaphore: %v\nwant exit %d", r, exitConfig)
	}
	b.mustInit(t, name, 3)
	if _, st := b.statusJSON(t, name); st.Permits != 3 || st.Tokens != 3 || !st.Healthy {
		t.Fatalf("init after delete with another count: %+v", st)
	}
	if r := b.seminit(t, "delete", "--name", name); r.code != exitOK {
		t.Fatalf("delete with no holder: %v", r)
	}
}

// TestListDeleteGroup is TestListDelete on keys of a NATS group
// ($TOKENSEM_GROUP, as an init container would set it): list lists the
// group's keys, delete removes one key; --group is refused on RabbitMQ and
// when it is not a valid name.
func TestListDeleteGroup(t *testing.T) {
	t.Parallel()
	b := natsBroker()
	b.group = "cli"
	testListDelete(t, b)
	name := uniqueName(t)
	b.mustInit(t, name, 1)
	if _, st := b.statusJSON(t, name); st.Resource != "TOKENSEMG_cli" {
		t.Errorf("status of a key of group cli names %q, want the group's stream TOKENSEMG_cli", st.Resource)
	}
	if r := natsBroker().seminit(t, "list"); r.code != exitOK || strings.Contains(r.stdout, name) {
		t.Errorf("list without a group shows the group's key %s: %v", name, r)
	}
	if r := b.seminit(t, "delete", "--name", name); r.code != exitOK {
		t.Errorf("delete %s: %v", name, r)
	}
	if r := b.seminit(t, "list", "--group", "no.dots"); r.code != exitUsage || !strings.Contains(r.stderr, "--group") {
		t.Errorf("list --group no.dots: %v\nwant exit %d naming --group", r, exitUsage)
	}
	a := amqpBroker(t)
	if r := a.seminit(t, "list", "--group", "g"); r.code != exitUsage || !strings.Contains(r.stderr, "nats:// only") {
		t.Errorf("list --group on RabbitMQ: %v\nwant exit %d", r, exitUsage)
	}
}

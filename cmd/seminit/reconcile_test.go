package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem/natssem"
)

// TestReconcile damages a semaphore straight on the broker (a junk message
// and a copy of a token) and checks the reconcile contract: report only
// without --repair (exit 1 while unhealthy), repair with it (exit 0), JSON.
func TestReconcile(t *testing.T) {
	b := natsBroker()
	name := uniqueName(t)
	b.mustInit(t, name, 2)
	if r := b.seminit(t, "reconcile", "--name", name); r.code != exitOK || !strings.Contains(r.stdout, "healthy=true") {
		t.Fatalf("reconcile of a fresh semaphore: %v", r)
	}

	nc, err := nats.Connect(b.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := b.statusJSON(t, name)
	epoch, _ := raw["epoch"].(float64)                                                         // below 2^53: exact as a float64
	copied := fmt.Sprintf("t1.%s.0.%d.0123456789abcdef0123456789abcdef.", name, uint64(epoch)) // a copy of slot 0
	for _, data := range []string{"junk", copied} {
		if _, err := js.Publish(t.Context(), natssem.ResourcesOf(name, "").Subject, []byte(data)); err != nil {
			t.Fatal(err)
		}
	}

	r := b.seminit(t, "reconcile", "--name", name, "--json")
	if r.code != exitFailure {
		t.Fatalf("reconcile of a damaged semaphore without --repair: %v, want exit 1", r)
	}
	var rep struct {
		Name       string `json:"name"`
		Tokens     int    `json:"tokens"`
		Duplicates []int  `json:"duplicates"`
		Invalid    int    `json:"invalid"`
		Removed    int    `json:"removed"`
		Healthy    bool   `json:"healthy"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("reconcile --json: %v\n%s", err, r.stdout)
	}
	if rep.Name != name || rep.Tokens != 4 || len(rep.Duplicates) != 1 || rep.Invalid != 1 || rep.Removed != 0 || rep.Healthy {
		t.Fatalf("report = %+v", rep)
	}
	if r := b.seminit(t, "reconcile", "--name", name, "--repair"); r.code != exitOK || !strings.Contains(r.stdout, "removed 2") {
		t.Fatalf("reconcile --repair: %v", r)
	}
	if _, st := b.statusJSON(t, name); st.Tokens != 2 || !st.Healthy {
		t.Fatalf("status after the repair: %+v", st)
	}
}

// TestReconcileAMQP: a junk message in a RabbitMQ semaphore is reported,
// then removed by --repair.
func TestReconcileAMQP(t *testing.T) {
	b := amqpBroker(t)
	name := uniqueName(t)
	b.mustInit(t, name, 2)
	conn, err := amqp.Dial(b.url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", b.prefix+name, true, false, amqp.Publishing{Body: []byte("junk")})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := dc.WaitContext(ctx); !ok || err != nil {
		t.Fatalf("publish junk: %v %v", ok, err)
	}
	if r := b.seminit(t, "reconcile", "--name", name); r.code != exitFailure || !strings.Contains(r.stdout, "invalid 1") {
		t.Fatalf("reconcile with junk: %v, want exit 1 reporting it", r)
	}
	if r := b.seminit(t, "reconcile", "--name", name, "--repair"); r.code != exitOK || !strings.Contains(r.stdout, "removed 1") {
		t.Fatalf("reconcile --repair: %v", r)
	}
	if _, st := b.statusJSON(t, name); st.Tokens != 2 || !st.Healthy {
		t.Fatalf("status after the repair: %+v", st)
	}
}

// TestResizeCLI grows then shrinks a semaphore with seminit resize on every
// broker.
func TestResizeCLI(t *testing.T) {
	forEachBroker(t, func(t *testing.T, b broker) {
		name := uniqueName(t)
		b.mustInit(t, name, 2)
		// Growth and shrinking are told in their own words, not as damage.
		if r := b.seminit(t, "resize", "--name", name, "--permits", "4"); r.code != exitOK ||
			!strings.Contains(r.stdout, "grew from 2 to 4 permits: issued tokens for slots 2, 3") || strings.Contains(r.stdout, "missing") {
			t.Fatalf("resize 2 -> 4: %v", r)
		}
		if _, st := b.statusJSON(t, name); st.Permits != 4 || st.Tokens != 4 || !st.Healthy {
			t.Fatalf("after growing: %+v", st)
		}
		if r := b.seminit(t, "resize", "--name", name, "--permits", "1"); r.code != exitOK ||
			!strings.Contains(r.stdout, "shrank from 4 to 1 permit: retired 3 free tokens") || strings.Contains(r.stdout, "invalid") {
			t.Fatalf("resize 4 -> 1: %v", r)
		}
		if _, st := b.statusJSON(t, name); st.Permits != 1 || st.Tokens != 1 || !st.Healthy {
			t.Fatalf("after shrinking: %+v", st)
		}
		if r := b.seminit(t, "resize", "--name", name, "--permits", "0"); r.code != exitUsage {
			t.Fatalf("resize to 0: %v, want 64", r)
		}
	})
}

// TestResizeSteps: --step limits the rate of change; each step is a
// healthy semaphore of the intermediate size.
func TestResizeSteps(t *testing.T) {
	b := natsBroker()
	name := uniqueName(t)
	b.mustInit(t, name, 1)
	r := b.seminit(t, "resize", "--name", name, "--permits", "6", "--step", "2", "--interval", "10ms")
	if r.code != exitOK {
		t.Fatalf("stepped resize: %v", r)
	}
	for _, want := range []string{"grew from 1 to 3 permits", "grew from 3 to 5 permits", "grew from 5 to 6 permits: issued tokens for slot 5"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("stepped resize 1 -> 6 by 2: output lacks %q:\n%s", want, r.stdout)
		}
	}
	if _, st := b.statusJSON(t, name); st.Permits != 6 || st.Tokens != 6 || !st.Healthy {
		t.Fatalf("after the stepped resize: %+v", st)
	}
}

package amqpsem_test

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/amqpsem"
	"github.com/tokensem/tokensem/internal/ids"
	"github.com/tokensem/tokensem/internal/semtest"
)

// TestInvalidConfigFields: each field of the configuration is checked when
// read, the reissued slots' entries among them, and a bad one fails Open
// with ErrInvalidRecord saying which.
func TestInvalidConfigFields(t *testing.T) {
	n := name(t)
	initAMQP(t, n, 2)
	var orig []byte
	replaceConfig(t, n, func(old []byte) []byte { orig = old; return old })
	id := ids.New()
	tests := []struct {
		name, field string
		value       any
		want        string // in the error
	}{
		{"zero permits", "permits", 0, "permits 0 outside"},
		{"too many permits", "permits", tokensem.MaxPermits + 1, "permits 1048577 outside"},
		{"zero epoch", "epoch", 0, "epoch 0 outside"},
		{"epoch past 2^53", "epoch", uint64(1) << 60, "epoch 1152921504606846976 outside"},
		{"unknown state", "state", "weird", `state "weird"`},
		{"no state", "state", "", `state ""`},
		{"unknown queue type", "queue_type", "stream", `queue type "stream"`},
		{"unknown version", "v", 9, "version 9"},
		{"hold bound of years", "hold_bound_ms", int64(1) << 50, "hold bound 1125899906842624 ms outside"},
		{"no hold bound", "hold_bound_ms", 0, "hold bound 0 ms outside"},
		{"issued past the maximum", "issued", 2_000_000_000, "issued 2000000000 outside"},
		{"fence base past 2^63", "fence_base", uint64(1) << 63, "fence base 9223372036854775808"},
		{"reissued slot past the maximum", "reissued", map[string]any{"2000000": map[string]any{"id": id, "base": 1}}, "reissued slot 2000000 outside"},
		{"reissued token id", "reissued", map[string]any{"1": map[string]any{"id": "not-an-id", "base": 1}}, `token id "not-an-id"`},
		{"reissued base zero", "reissued", map[string]any{"1": map[string]any{"id": id, "base": 0}}, "fence base 0 outside"},
		{"reissued not a map", "reissued", []int{1, 2}, "not JSON of the expected shape"},
		{"padded", "pad", strings.Repeat("x", 9000), "more than the 8192 a configuration of 0 reissued slots may have"}, // 4 KiB + a controller record's
		{"a controller record of junk", "ctl", strings.Repeat("x", 9000), "more than the 8192 a configuration of 0 reissued slots may have"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			replaceConfig(t, n, func([]byte) []byte { return semtest.EditJSON(t, orig, tc.field, tc.value) })
			_, err := amqpsem.Open(t.Context(), dial(t, broker.Addr, 0), n)
			if !errors.Is(err, tokensem.ErrInvalidRecord) || !strings.Contains(err.Error(), tc.want) || len(err.Error()) > 512 {
				t.Errorf("open: %v\nwant ErrInvalidRecord saying %q, at most 512 bytes", err, tc.want)
			}
		})
	}
	replaceConfig(t, n, func([]byte) []byte { return orig })
	if _, err := amqpsem.Open(t.Context(), dial(t, broker.Addr, 0), n); err != nil {
		t.Fatalf("open with the configuration put back: %v", err)
	}
}

// TestRegistryDropsJunk: registry entries no Init writes (100 kB of
// garbage, a name that is not one) are dropped by the next List at once,
// young or old, and never listed; a young entry of a valid name without a
// semaphore stays (its Init may still be creating it).
func TestRegistryDropsJunk(t *testing.T) {
	p := ownPlace(t)
	marker := ids.New()
	young := "young-" + marker[:8]
	junk := [][]byte{
		[]byte(`{"name":"bad name ` + marker + `"}`),
		[]byte(`{"name":"` + young + `"}`),
	}
	// Big entries take a while to deliver: the List must wait for every
	// one on its way (a loaded CI saw one List miss two), not end on a
	// pause.
	for i := range 20 {
		junk = append(junk, []byte(fmt.Sprintf("%s-%d", marker, i)+strings.Repeat("\x00garbage\xff", 10<<10)))
	}
	p.fillRegistry(t, time.Now(), junk...)
	infos, err := amqpsem.List(semtest.Context(t, time.Minute), p.dial(t))
	if err != nil {
		t.Fatalf("list with junk in the registry: %v", err)
	}
	for _, in := range infos {
		if strings.Contains(in.Name, marker) || in.Name == young {
			t.Errorf("list shows %+v", in)
		}
	}
	left := p.registryEntries(t)
	for _, body := range left {
		if bytes.Contains(body, []byte(marker)) {
			t.Errorf("the registry still holds %.40q after a List", body)
		}
	}
	found := false
	for _, body := range left {
		found = found || bytes.Contains(body, []byte(young))
	}
	if !found {
		t.Errorf("a List dropped the young entry of %s, whose Init may still be creating it", young)
	}
	// Not kept for the next test run: taken out now.
	p.dropRegistryEntries(t, func(body []byte) bool { return bytes.Contains(body, []byte(young)) })
}

// TestListDropsEveryJunkEntry: one List drops every junk entry of the
// registry, however many: 300 here. RabbitMQ 3.10 drops settlements a
// quorum queue's channel still holds back when the channel closes; a List
// that acked its junk and closed left up to 254 of 300 (see ackEntries).
func TestListDropsEveryJunkEntry(t *testing.T) {
	p := ownPlace(t)
	marker := ids.New()
	const n = 300
	junk := make([][]byte, n)
	for i := range junk {
		junk[i] = []byte(fmt.Sprintf("junk %s %d", marker, i))
	}
	p.fillRegistry(t, time.Now(), junk...)
	if _, err := amqpsem.List(semtest.Context(t, time.Minute), p.dial(t)); err != nil {
		t.Fatal(err)
	}
	left := 0
	for _, body := range p.registryEntries(t) {
		if bytes.Contains(body, []byte(marker)) {
			left++
		}
	}
	if left > 0 {
		t.Errorf("%d of %d junk entries left after a List", left, n)
		p.dropRegistryEntries(t, func(body []byte) bool { return bytes.Contains(body, []byte(marker)) })
	}
}

// registryEntries reads every registry entry of p under the registry's lock, as
// List does, and puts them back.
func (p place) registryEntries(t *testing.T) [][]byte {
	var out [][]byte
	p.dropRegistryEntries(t, func(body []byte) bool { out = append(out, body); return false })
	return out
}

// dropRegistryEntries takes p's registry's lock (its exclusive lock queue,
// as List does), waits until an earlier reader's entries are back, reads
// every entry and removes those drop picks.
func (p place) dropRegistryEntries(t *testing.T, drop func([]byte) bool) {
	t.Helper()
	conn, err := amqp.Dial(string(p))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for deadline := time.Now().Add(30 * time.Second); ; {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if _, err = ch.QueueDeclare("tokensem..registry.lock", false, false, true, false, nil); err == nil {
			defer func() { _, _ = ch.QueueDelete("tokensem..registry.lock", false, false, false) }()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("taking the registry lock: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	// An earlier reader's entries are back once it has no consumer left.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		q, err := ch.QueueDeclarePassive("tokensem..registry", true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if q.Consumers == 0 || time.Now().After(deadline) {
			break
		}
	}
	if err := ch.Qos(65535, 0, false); err != nil {
		t.Fatal(err)
	}
	ds, err := ch.Consume("tokensem..registry", "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Read until a marker published once every entry is handed to this
	// reader (nothing ready, no other consumer) comes back: every entry
	// on its way is in by then (see amqpsem's readRegistry).
	var end []byte
	acked := 0
	check := time.NewTimer(50 * time.Millisecond)
	defer check.Stop()
	for deadline := time.Now().Add(30 * time.Second); ; {
		select {
		case d, ok := <-ds:
			if !ok {
				t.Fatal("the registry consumer was cancelled")
			}
			if end != nil && bytes.Equal(d.Body, end) {
				_ = d.Ack(false)
				return // the channel's close puts the rest back
			}
			if drop(d.Body) {
				_ = d.Ack(false)
				// A get every 16 acks waits for the queue to apply them:
				// settlements beyond 32 unapplied ones wait in the channel
				// and a close drops them (see amqpsem's ackEntries).
				if acked++; acked%16 == 0 {
					if _, _, err := ch.Get("tokensem..registry", false); err != nil {
						t.Fatal(err)
					}
				}
			}
		case <-check.C:
			if time.Now().After(deadline) {
				t.Fatal("the registry read did not end in 30 s")
			}
			check.Reset(50 * time.Millisecond)
			if end != nil {
				continue
			}
			q, err := ch.QueueDeclarePassive("tokensem..registry", true, false, false, false, nil)
			if err != nil {
				t.Fatal(err)
			}
			if q.Consumers != 1 || q.Messages != 0 {
				continue
			}
			end = []byte(`{"test-end":"` + ids.New() + `"}`)
			pub, err := conn.Channel()
			if err != nil {
				t.Fatal(err)
			}
			if err := pub.Confirm(false); err != nil {
				t.Fatal(err)
			}
			dc, err := pub.PublishWithDeferredConfirmWithContext(t.Context(), "", "tokensem..registry", true, false,
				amqp.Publishing{DeliveryMode: amqp.Persistent, Body: end})
			if err != nil {
				t.Fatal(err)
			}
			if ok, err := dc.WaitContext(t.Context()); !ok || err != nil {
				t.Fatalf("the read's end marker confirmed %v: %v", ok, err)
			}
			_ = pub.Close()
		}
	}
}

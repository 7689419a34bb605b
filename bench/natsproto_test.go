package main

import (
	"strings"
	"testing"
	"time"
)

// TestNATSProtocols plays each protocol briefly on an embedded server: each
// must move tokens, never admit more than N at once, and (in a loop with no
// crashes) never lose a compare-and-set.
func TestNATSProtocols(t *testing.T) {
	n, err := startNATS("", "")
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	for _, p := range natsProtocols {
		t.Run(p, func(t *testing.T) {
			c, err := n.natsProtocolContention(t.Context(), p, 8, 2, time.Millisecond, 300*time.Millisecond, true)
			if err != nil {
				t.Fatal(err)
			}
			if c.Acquisitions == 0 || c.Peak < 1 || c.Peak > 2 || c.Conflicts != 0 {
				t.Errorf("contention: %d acquisitions, peak %d of 2, %d lost compare-and-sets", c.Acquisitions, c.Peak, c.Conflicts)
			}
			h, err := n.natsProtocolHandoff(t.Context(), p, 20, 0)
			if err != nil {
				t.Fatal(err)
			}
			if h.N != 20 || h.P50 <= 0 {
				t.Errorf("handoff: %d samples, p50 %v", h.N, h.P50)
			}
		})
	}
}

// TestNATSProtocolsVerdict: natssem's target against Redis says what the
// protocols reached, and whose limit the gap is.
func TestNATSProtocolsVerdict(t *testing.T) {
	r := sampleReport()
	ns := r.system("natssem")
	for _, s := range r.Systems {
		if s.Key == "redis-fast" {
			s.Skipped = ""
			s.Contention = &ContentionResult{Workers: 32, N: 4, Hold: time.Millisecond, Throughput: 3000, Ceiling: 4000, Peak: 4}
		}
	}
	ns.Contention.Throughput = 2400
	set := func(queue, register, kv float64) {
		ns.NATSProtocols = nil
		for p, thr := range map[string]float64{protoQueue: queue, protoRegister: register, protoKV: kv} {
			ns.natsProtocol(p).Contention = &NATSProtocolContention{Protocol: p, N: 4, Throughput: thr, Ceiling: 4000}
		}
	}
	why := func() string {
		for _, tg := range Targets(r) {
			if tg.System == "natssem" && strings.Contains(tg.Goal, "Redis") {
				return tg.Why
			}
		}
		t.Fatal("no target against Redis")
		return ""
	}
	for _, tt := range []struct {
		queue, register, kv float64
		want                string
	}{
		{2900, 2700, 2500, "the broker's own handoff is the limit"},
		{3100, 2700, 2500, "cannot skip"},
		{3300, 3100, 2500, "the gap is natssem's protocol"},
	} {
		set(tt.queue, tt.register, tt.kv)
		if w := why(); !strings.Contains(w, tt.want) || !strings.Contains(w, "natssem's protocol 2,500/s = 0.83×") {
			t.Errorf("queue %v register %v: %s", tt.queue, tt.register, w)
		}
	}
	var b strings.Builder
	writeNATSProtocols(&b, r, ns)
	if !strings.Contains(b.String(), "| natssem (the library, above) | yes | 2,400/s (60%) | 0.80× |") {
		t.Errorf("table:\n%s", b.String())
	}
}

package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestHTTPGate runs the self-demo on the embedded server and checks its
// claims: every request answered 200 or 429, both happen, no tenant ever
// above its permits while the permits were fully used, and every permit
// back afterwards.
func TestHTTPGate(t *testing.T) {
	defer goleak.VerifyNone(t)
	// The defaults: 2 tenants with 8 requests in flight each for 2 permits;
	// a handler works 50 ms and a request waits at most 100 ms, so the
	// first two of a burst are served at once, and the seventh and later in
	// line would need three handlers' turns (150 ms): both answers occur.
	cfg := defaultConfig()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	rep, err := run(ctx, cfg, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatalf("httpgate: %v", err)
	}
	if rep.OK+rep.Rejected != cfg.requests {
		t.Fatalf("%d × 200 + %d × 429 != %d requests", rep.OK, rep.Rejected, cfg.requests)
	}
	if rep.OK == 0 || rep.Rejected == 0 {
		t.Fatalf("%d × 200, %d × 429: want both", rep.OK, rep.Rejected)
	}
	if len(rep.Tenants) != cfg.tenants {
		t.Fatalf("%d tenants in the report, want %d", len(rep.Tenants), cfg.tenants)
	}
	for _, tr := range rep.Tenants {
		if tr.MaxActive > cfg.permits {
			t.Errorf("tenant %s: %d handlers at once, %d permits", tr.Name, tr.MaxActive, cfg.permits)
		}
		if tr.MaxActive < cfg.permits {
			t.Errorf("tenant %s: never used all %d permits (max %d): the run proves nothing", tr.Name, cfg.permits, tr.MaxActive)
		}
		if tr.Available != cfg.permits {
			t.Errorf("tenant %s: %d of %d permits available afterwards", tr.Name, tr.Available, cfg.permits)
		}
	}
	if rep.MaxActive > cfg.tenants*cfg.permits {
		t.Errorf("%d handlers at once across %d tenants of %d permits", rep.MaxActive, cfg.tenants, cfg.permits)
	}
	for _, want := range []string{"tenant a:", "tenant b:", "× 429 (Retry-After 1s)", "total:"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

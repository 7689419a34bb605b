package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestConsumer runs the demo on the embedded server: every job processed
// exactly once, the stream drained, never more than the permits in
// processing at once (and the permits fully used: 8 workers contend for
// 3), every permit back.
func TestConsumer(t *testing.T) {
	defer goleak.VerifyNone(t)
	cfg := defaultConfig()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	rep, err := run(ctx, cfg, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatalf("consumer: %v", err)
	}
	if rep.Duplicates != 0 || rep.Missing != 0 || rep.Left != 0 {
		t.Fatalf("%d duplicated, %d missing, %d left in the stream", rep.Duplicates, rep.Missing, rep.Left)
	}
	if rep.Processed != cfg.jobs {
		t.Fatalf("%d acknowledgements for %d jobs", rep.Processed, cfg.jobs)
	}
	sum := 0
	for _, n := range rep.PerWorker {
		sum += n
	}
	if sum != cfg.jobs {
		t.Fatalf("workers acknowledged %d jobs, want %d", sum, cfg.jobs)
	}
	if rep.MaxActive > cfg.permits {
		t.Fatalf("%d jobs in processing at once, %d permits", rep.MaxActive, cfg.permits)
	}
	if rep.MaxActive < cfg.permits {
		t.Fatalf("never %d jobs at once (max %d): the run proves nothing", cfg.permits, rep.MaxActive)
	}
	if rep.Available != cfg.permits {
		t.Fatalf("%d of %d permits available afterwards", rep.Available, cfg.permits)
	}
	if !strings.Contains(out.String(), "most jobs in processing at once: 3 of 3 permits") {
		t.Error("output lacks the concurrency line")
	}
}

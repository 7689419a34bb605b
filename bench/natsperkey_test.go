package main

import (
	"errors"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// TestPerKeyFloor: the plain JetStream layout of per-key semaphores moves
// every key's tokens, times each create and each cycle of the second
// round, and leaves nothing behind.
func TestPerKeyFloor(t *testing.T) {
	n, err := startNATS(t.Context(), "", "", false)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	const keys, lone = 25, 40
	f, err := n.perKeyFloor(t.Context(), keys, 2, lone, 4)
	if err != nil {
		t.Fatal(err)
	}
	if f.Count != keys || f.Create.N != keys || f.Cycle.N != keys || f.Lone.N != lone {
		t.Fatalf("samples: %d keys, %d creates, %d cycles, %d lone cycles; want %d, %d, %d, %d",
			f.Count, f.Create.N, f.Cycle.N, f.Lone.N, keys, keys, keys, lone)
	}
	if f.Create.P50 <= 0 || f.Cycle.P50 <= 0 || f.Lone.P50 <= 0 || f.Ratio() <= 0 {
		t.Fatalf("empty timings: %+v", f)
	}
	if _, err := n.js.Stream(t.Context(), perKeyStream); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("the per-key stream outlived the measurement: %v", err)
	}
	if _, err := n.js.KeyValue(t.Context(), perKeyBucket); !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Errorf("the per-key bucket outlived the measurement: %v", err)
	}
}

// TestManySemsServerCost: with the server in the harness's process, the
// sems scenario charges it what the semaphores left on it.
func TestManySemsServerCost(t *testing.T) {
	n, err := startNATS(t.Context(), "", "", false)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	r, err := runManySems(t.Context(), n, "cost", 30, 2, 4)
	if err != nil {
		t.Fatal(err)
	}
	c := r.Server
	if c == nil {
		t.Fatal("no server cost for an embedded server")
	}
	// Each semaphore is at least a stream, a bucket and a consumer, each
	// with goroutines and state of its own on the server.
	if c.HeapPerSem <= 0 || c.StackPerSem <= 0 || c.Goroutines < 30 {
		t.Fatalf("server cost of 30 semaphores: %+v", *c)
	}
}

package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"strings"
	"testing"
)

// TestMain lets this test binary serve as the fleet's worker processes,
// which the program starts by re-executing itself.
func TestMain(m *testing.M) {
	if len(os.Args) == 3 && os.Args[1] == "worker" {
		os.Exit(worker(os.Args[2]))
	}
	os.Exit(m.Run())
}

// TestFleet runs the quickstart end to end: real worker processes, one of
// them SIGKILLed while holding a permit.
func TestFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for about 11 seconds")
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	var out bytes.Buffer
	copied := make(chan struct{})
	go func() { _, _ = io.Copy(&out, r); close(copied) }()
	err = run(context.Background())
	os.Stdout = stdout
	_ = w.Close()
	<-copied
	t.Log(out.String())
	if err != nil {
		t.Fatalf("fleet: %v", err)
	}
	for _, want := range []string{"most holders at once: 3 of 3", "SIGKILL worker", "is back", "healthy=true"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

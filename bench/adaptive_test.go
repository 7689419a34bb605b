package main

import (
	"bytes"
	"encoding/xml"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestSettledAt(t *testing.T) {
	s := time.Second
	counts := []CountPoint{{0, 4}, {2 * s, 10}, {5 * s, 13}, {8 * s, 15}, {9 * s, 12}, {31 * s, 4}}
	for _, tc := range []struct {
		c        int
		from, to time.Duration
		want     time.Duration
	}{
		{12, 0, 30 * s, 9 * s},        // 15 at 8 s left the range; 12 from 9 s on
		{12, 10 * s, 30 * s, 0},       // in range since before the phase
		{12, 0, 32 * s, -1},           // 4 at 31 s: not there at the end
		{4, 30 * s, 40 * s, 1 * s},    // the phase began at 12, 4 from 31 s
		{13, 3 * s, 8*s + s/2, 2 * s}, // 13 from 5 s, to the phase's end
		{100, 0, 30 * s, time.Duration(-1)},
	} {
		if got := settledAt(counts, tc.c, tc.from, tc.to); got != tc.want {
			t.Errorf("settledAt(C=%d, %v..%v) = %v, want %v", tc.c, tc.from, tc.to, got, tc.want)
		}
	}
}

// TestQueueDownstream: uses beyond C wait for a server; a raised C starts
// a waiting use, and the servers' count ends clean. Only lower bounds are
// timed (a sleep never ends early), so the test holds on a slow machine.
func TestQueueDownstream(t *testing.T) {
	const service = 30 * time.Millisecond
	d := &queueDownstream{service: service}
	d.setC(2)
	var mu sync.Mutex
	var ends []time.Duration // since start: the goroutines may start late, never early
	var wg sync.WaitGroup
	start := time.Now()
	for range 4 {
		wg.Go(func() {
			d.use()
			mu.Lock()
			ends = append(ends, time.Since(start))
			mu.Unlock()
		})
	}
	wg.Wait()
	slices.Sort(ends)
	if ends[0] < service || ends[2] < 2*service {
		t.Fatalf("4 uses on 2 servers of %v: ended after %v, want two after at least %v", service, ends, 2*service)
	}

	d.setC(1)
	first := make(chan time.Duration)
	go func() { first <- d.use() }()
	time.Sleep(5 * time.Millisecond) // the first use has the server
	second := make(chan time.Duration)
	go func() { second <- d.use() }()
	time.Sleep(5 * time.Millisecond)
	d.setC(2) // the queued use starts
	<-first
	if l := <-second; l < service {
		t.Fatalf("the second use took %v, less than its service", l)
	}
	if d.busy != 0 || len(d.queue) != 0 {
		t.Fatalf("after the uses: %d busy, %d queued", d.busy, len(d.queue))
	}
}

func TestWriteSteps(t *testing.T) {
	var b bytes.Buffer
	series := []StepSeries{
		{Label: "C", Points: []CountPoint{{0, 12}, {30 * time.Second, 6}}, Dashed: true},
		{Label: "natssem: adaptive count", Points: []CountPoint{{0, 4}, {5 * time.Second, 12}}},
	}
	if err := WriteSteps(&b, "title <&>", "permits", series, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := xml.Unmarshal(b.Bytes(), new(struct{})); err != nil {
		t.Fatalf("not XML: %v", err)
	}
	if n := strings.Count(b.String(), "<polyline"); n != len(series) {
		t.Fatalf("%d polylines for %d series", n, len(series))
	}
	if WriteSteps(&b, "t", "y", nil, time.Minute) == nil {
		t.Fatal("no series: no error")
	}
}

package semtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/adaptive"
	"github.com/tokensem/tokensem/reconciler"
)

// controlRecorder is a semaphore that keeps its controller's record.
type controlRecorder interface {
	tokensem.Semaphore
	Resize(ctx context.Context, permits int) (reconciler.Report, error)
	RecordController(ctx context.Context, r adaptive.Record) error
	ControllerRecord(ctx context.Context) (adaptive.Record, bool, error)
}

// testControllerRecord: a semaphore has no controller record until one is
// written; a written one reads back whole, from another client too, and
// the next replaces it; a resize keeps it; a record out of bounds is
// refused and changes nothing; a new life of the name starts without one.
func testControllerRecord(t *testing.T, b Backend) {
	name := uniqueName(t)
	s, ok := mustInit(t, b, name, 2, Options{}).(controlRecorder)
	if !ok {
		t.Skipf("%s semaphores keep no controller record", b.Name)
	}
	ctx := Context(t, time.Minute)
	read := func(s controlRecorder) (adaptive.Record, bool) {
		t.Helper()
		r, ok, err := s.ControllerRecord(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return r, ok
	}
	if r, ok := read(s); ok {
		t.Fatalf("a new semaphore has a controller record: %+v", r)
	}
	at := time.Now().Round(time.Millisecond)
	first := adaptive.Record{By: "controller A", Leader: name + "-adapt", Min: 1, Max: 8, Algorithm: "gradient", Since: at, At: at}.
		Add(adaptive.Change{At: at, From: 2, To: 3, Why: "latency 12ms"})
	if err := s.RecordController(ctx, first); err != nil {
		t.Fatal(err)
	}
	other := mustOpen(t, b, b.Addr, name, Options{}).(controlRecorder)
	same := func(got, want adaptive.Record) bool {
		if got.By != want.By || got.Leader != want.Leader || got.Min != want.Min || got.Max != want.Max ||
			got.Algorithm != want.Algorithm || !got.Since.Equal(want.Since) || !got.At.Equal(want.At) ||
			len(got.Changes) != len(want.Changes) {
			return false
		}
		for i, g := range got.Changes {
			w := want.Changes[i]
			if !g.At.Equal(w.At) || g.From != w.From || g.To != w.To || g.Why != w.Why {
				return false
			}
		}
		return true
	}
	if r, ok := read(other); !ok || !same(r, first) {
		t.Fatalf("another client reads %+v (%v); want %+v", r, ok, first)
	}
	second := first.Add(adaptive.Change{At: at.Add(time.Second), From: 3, To: 4})
	second.By = "controller B"
	if err := other.RecordController(ctx, second); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Resize(ctx, 4); err != nil {
		t.Fatal(err)
	}
	if r, ok := read(s); !ok || !same(r, second) {
		t.Fatalf("after a second record and a resize: %+v (%v); want %+v", r, ok, second)
	}
	bad := second
	bad.Min = 0
	if err := s.RecordController(ctx, bad); !errors.Is(err, tokensem.ErrInvalidOption) {
		t.Fatalf("a record with range 0..8: %v; want ErrInvalidOption", err)
	}
	if r, _ := read(s); !same(r, second) {
		t.Fatalf("a refused record changed the stored one: %+v", r)
	}
	if b.Delete == nil {
		return
	}
	if err := b.Delete(t, name, true); err != nil {
		t.Fatal(err)
	}
	again := mustInit(t, b, name, 2, Options{}).(controlRecorder)
	if r, ok := read(again); ok {
		t.Fatalf("a new life of %s has the last life's controller record: %+v", name, r)
	}
}

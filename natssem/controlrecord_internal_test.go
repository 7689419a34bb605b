package natssem

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/adaptive"
)

// A controller record someone else wrote (junk, too long, or a record of
// an earlier life) is refused or ignored by ControllerRecord alone: the
// semaphore's status and permits are untouched, and the next
// RecordController writes over it.
func TestControllerRecordWrittenByOthers(t *testing.T) {
	ctx := testContext(t)
	nc := dial(t, startServer(t))
	s, err := Init(ctx, nc, "ctl", 2)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	good := adaptive.Record{By: "me", Leader: "ctl-adapt", Min: 1, Max: 4, Since: time.Now(), At: time.Now()}
	rec, _ := adaptive.EncodeRecord(good)
	for what, data := range map[string][]byte{
		"junk":              []byte("not json"),
		"900 KiB":           bytes.Repeat([]byte("x"), 900<<10),
		"a bad record":      mustMarshal(controllerEntry{Epoch: s.config().Epoch, Record: []byte(`{"by":"","leader":"x","min":1,"max":2}`)}),
		"a long record":     mustMarshal(controllerEntry{Epoch: s.config().Epoch, Record: append(append([]byte(`{"by":"me","leader":"x","min":1,"max":2,"algorithm":"`), bytes.Repeat([]byte("a"), adaptive.MaxRecordLen)...), `"}`...)}),
		"an earlier life's": mustMarshal(controllerEntry{Epoch: s.config().Epoch + 1, Record: rec}),
	} {
		if _, err := s.kv.Put(ctx, s.lay.key(controllerKey), data); err != nil {
			t.Fatal(err)
		}
		r, ok, err := s.ControllerRecord(ctx)
		switch {
		case what == "an earlier life's":
			if ok || err != nil {
				t.Errorf("%s: ControllerRecord %+v, %v, %v; want none", what, r, ok, err)
			}
		case !errors.Is(err, tokensem.ErrInvalidRecord):
			t.Errorf("%s: ControllerRecord %+v, %v, %v; want ErrInvalidRecord", what, r, ok, err)
		}
		p, err := s.Acquire(ctx)
		if err != nil {
			t.Fatalf("%s: acquire beside it: %v", what, err)
		}
		_ = p.Release(ctx)
		if st, err := s.Status(ctx); err != nil || !st.Healthy {
			t.Fatalf("%s: status beside it: %+v, %v", what, st, err)
		}
	}
	// What JSON may escape six bytes long, at the record's bounds, is
	// stored as itself.
	for range adaptive.MaxChanges {
		good = good.Add(adaptive.Change{From: 1, To: 2, Why: strings.Repeat("<&>", 32)})
	}
	if err := s.RecordController(ctx, good); err != nil {
		t.Fatal(err)
	}
	if r, ok, err := s.ControllerRecord(ctx); err != nil || !ok || r.By != "me" || len(r.Changes) != adaptive.MaxChanges {
		t.Fatalf("after a good record: %+v, %v, %v", r, ok, err)
	}
	// A semaphore deleted meanwhile gets no record (in a group, it would
	// stay in the group's bucket).
	if err := Delete(ctx, nc, "ctl"); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordController(ctx, good); !errors.Is(err, tokensem.ErrNotInitialized) {
		t.Fatalf("a record of a deleted semaphore: %v; want ErrNotInitialized", err)
	}
}

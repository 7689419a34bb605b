package amqpsem_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/adaptive"
	"github.com/tokensem/tokensem/amqpsem"
)

// A controller record someone else wrote into the configuration is refused
// by ControllerRecord alone when it is not one RecordController writes: the
// semaphore admits, counts and resizes as before, and the next write of the
// configuration (a resize, a record) leaves the bad one out. A record is
// stored as RecordController encodes it, whoever wrote it, so it cannot
// grow when the configuration is written again.
func TestControllerRecordWrittenByOthers(t *testing.T) {
	t.Parallel()
	n := name(t)
	s := initAMQP(t, n, 2)
	setCtl := func(v string) {
		replaceConfig(t, n, func(old []byte) []byte {
			var m map[string]json.RawMessage
			if err := json.Unmarshal(old, &m); err != nil {
				t.Fatal(err)
			}
			m["ctl"] = json.RawMessage(v)
			var b bytes.Buffer
			enc := json.NewEncoder(&b)
			enc.SetEscapeHTML(false) // as written, not escaped six bytes a character
			if err := enc.Encode(m); err != nil {
				t.Fatal(err)
			}
			return b.Bytes()
		})
	}
	permits := 2
	for what, v := range map[string]string{
		"a number":      `7`,
		"no controller": `{"by":"","leader":"x","min":1,"max":2}`,
		"a bad range":   `{"by":"me","leader":"x","min":3,"max":2}`,
		"too long":      `"` + strings.Repeat("x", adaptive.MaxRecordLen) + `"`,
	} {
		setCtl(v)
		r, ok, err := s.ControllerRecord(t.Context())
		if !errors.Is(err, tokensem.ErrInvalidRecord) {
			t.Errorf("%s: ControllerRecord %+v, %v, %v; want ErrInvalidRecord", what, r, ok, err)
		}
		p, err := s.Acquire(t.Context())
		if err != nil {
			t.Fatalf("%s: acquire beside it: %v", what, err)
		}
		_ = p.Release(t.Context())
		permits = 5 - permits // 2, 3, 2, …
		if _, err := s.Resize(t.Context(), permits); err != nil {
			t.Fatalf("%s: resize beside it: %v", what, err)
		}
		if st, err := s.Status(t.Context()); err != nil || st.Permits != permits {
			t.Fatalf("%s: status after the resize: %+v, %v", what, st, err)
		}
		if r, ok, err := s.ControllerRecord(t.Context()); ok || err != nil {
			t.Errorf("%s: after the resize, ControllerRecord %+v, %v, %v; want none", what, r, ok, err)
		}
	}
	// A good record of what JSON may escape six bytes long (<, >, &, as
	// the standard encoder does), at its bounds: written again and again,
	// it stays one.
	change := `{"at":"2026-11-28T00:00:00Z","from":1,"to":2,"why":"` + strings.Repeat("<&>", 32) + `"}`
	good := `{"by":"me <&>","leader":"x","min":1,"max":4,"since":"2026-11-28T00:00:00Z","at":"2026-11-28T00:00:00Z",` +
		`"changes":[` + strings.Repeat(change+",", adaptive.MaxChanges-1) + change + `]}`
	setCtl(good)
	for i := range 3 {
		permits = 5 - permits
		if _, err := s.Resize(t.Context(), permits); err != nil {
			t.Fatalf("resize %d beside a good foreign record: %v", i, err)
		}
	}
	c := dial(t, broker.Addr, 0)
	o, err := amqpsem.Open(t.Context(), c, n)
	if err != nil {
		t.Fatalf("open after resizes beside a good foreign record: %v", err)
	}
	defer o.Close()
	if r, ok, err := o.ControllerRecord(t.Context()); err != nil || !ok || r.By != "me <&>" || len(r.Changes) != adaptive.MaxChanges {
		t.Fatalf("the good foreign record after resizes: %+v, %v, %v", r, ok, err)
	}
	mine := adaptive.Record{By: "me", Leader: n + "-adapt", Min: 1, Max: 4, Since: time.Now(), At: time.Now()}
	if err := s.RecordController(t.Context(), mine); err != nil {
		t.Fatal(err)
	}
	if r, ok, err := o.ControllerRecord(t.Context()); err != nil || !ok || r.By != "me" {
		t.Fatalf("after a good record: %+v, %v, %v", r, ok, err)
	}
}

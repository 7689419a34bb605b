package amqpsem_test

import (
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
// by ControllerRecord alone when it is not one RecordController writes:
// the semaphore admits and counts as before, and the next RecordController
// writes over it. One longer than a record may be makes the whole
// configuration invalid, as any oversized field does.
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
			b, _ := json.Marshal(m)
			return b
		})
	}
	for what, v := range map[string]string{
		"a number":      `7`,
		"no controller": `{"by":"","leader":"x","min":1,"max":2}`,
		"a bad range":   `{"by":"me","leader":"x","min":3,"max":2}`,
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
		if st, err := s.Status(t.Context()); err != nil || st.Permits != 2 {
			t.Fatalf("%s: status beside it: %+v, %v", what, st, err)
		}
	}
	good := adaptive.Record{By: "me", Leader: n + "-adapt", Min: 1, Max: 4, Since: time.Now(), At: time.Now()}
	if err := s.RecordController(t.Context(), good); err != nil {
		t.Fatal(err)
	}
	if r, ok, err := s.ControllerRecord(t.Context()); err != nil || !ok || r.By != "me" {
		t.Fatalf("after a good record: %+v, %v, %v", r, ok, err)
	}
	setCtl(`"` + strings.Repeat("x", adaptive.MaxRecordLen) + `"`)
	c := dial(t, broker.Addr, 0)
	if _, err := amqpsem.Open(t.Context(), c, n); !errors.Is(err, tokensem.ErrInvalidRecord) {
		t.Fatalf("open with a controller record of %d bytes: %v; want ErrInvalidRecord", adaptive.MaxRecordLen+2, err)
	}
}

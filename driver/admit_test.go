package driver_test

import (
	"errors"
	"testing"

	"github.com/tokensem/tokensem/driver"
)

// TestAdmit: a token that looks retired under the cached count is judged
// again against a count read afresh (a grown semaphore admits it); junk is
// refused without a read; a failed read is returned as it is.
func TestAdmit(t *testing.T) {
	codec := driver.NewCodec(nil)
	tok := driver.NewToken("jobs", 2, 7)
	data, err := codec.Encode(tok)
	if err != nil {
		t.Fatal(err)
	}
	judge := func(permits int) driver.Entry { return driver.Classify(codec, "jobs", permits, 7, data) }
	reads := 0
	cached := func() (int, error) { return 2, nil }
	grown := func() (int, error) { reads++; return 3, nil }

	got, permits, err := driver.Admit(cached, grown, judge)
	if err != nil || got != tok || permits != 3 || reads != 1 {
		t.Fatalf("token of slot 2 after a grow to 3: %v, %d permits, %v, %d reads; want it admitted by 3 after one read", got, permits, err, reads)
	}
	_, _, err = driver.Admit(cached, func() (int, error) { return 2, nil }, judge)
	if !errors.Is(err, driver.ErrNotCurrent) {
		t.Fatalf("token of slot 2 of 2 permits: %v, want ErrNotCurrent", err)
	}
	reads = 0
	junk := func(int) driver.Entry { return driver.Classify(codec, "jobs", 3, 7, []byte("junk")) }
	if _, _, err := driver.Admit(cached, grown, junk); !errors.Is(err, driver.ErrNotCurrent) || reads != 0 {
		t.Fatalf("junk: %v after %d reads, want ErrNotCurrent and no read", err, reads)
	}
	broken := errors.New("broker down")
	if _, _, err := driver.Admit(cached, func() (int, error) { return 0, broken }, judge); !errors.Is(err, broken) {
		t.Fatalf("failed read: %v, want %v", err, broken)
	}
}

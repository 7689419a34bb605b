package driver_test

import (
	"bytes"
	"testing"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/driver"
)

// TestGateName: a gate's name is no semaphore's name, yet the codec takes
// its tokens (codec.go knows the prefix too).
func TestGateName(t *testing.T) {
	g := driver.GateName("jobs")
	if !driver.IsGate(g) || driver.IsGate("jobs") {
		t.Fatalf("IsGate(%q) or IsGate(jobs) wrong", g)
	}
	if err := tokensem.ValidateName(g); err == nil {
		t.Fatalf("ValidateName(%q) = nil: a user could name a semaphore like a gate", g)
	}
	c := driver.NewCodec(nil)
	tok := driver.NewToken(g, 0, 1)
	b, err := c.Encode(tok)
	if err != nil {
		t.Fatalf("encode a gate token: %v", err)
	}
	got, err := c.Decode(b)
	if err != nil || got != tok {
		t.Fatalf("decode a gate token: %+v, %v", got, err)
	}
	other := bytes.Replace(b, []byte(g), []byte("_other_jobs"), 1)
	if bytes.Equal(other, b) {
		t.Fatalf("name not found in the encoding %q", b)
	}
	if _, err := c.Decode(other); err == nil {
		t.Fatalf("a token of another '_' name decoded: %q", other)
	}
}

package natssem

import (
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/tokensem/tokensem"
)

// TestLayoutNames: a refused subject concerns the semaphore whose
// resources it names, and a key of a group only for the group's shared
// resources or its own.
func TestLayoutNames(t *testing.T) {
	lone, k1 := newLayout("", "A"), newLayout("G", "k1")
	for _, tc := range []struct {
		subject string
		lay     layout
		want    bool
	}{
		{"$JS.API.STREAM.INFO.TOKENSEM_A", lone, true},
		{"$JS.API.STREAM.INFO.KV_tokensem_A", lone, true},
		{"$JS.API.DIRECT.GET.KV_tokensem_A.$KV.tokensem_A.slot.0", lone, true},
		{"$KV.tokensem_A.config", lone, true},
		{"$JS.ACK.TOKENSEM_A.holders.1.2.3.4.5", lone, true},
		{"tokensem.A.tokens", lone, true},
		{"$JS.API.STREAM.INFO.TOKENSEM_AB", lone, false},
		{"$JS.API.STREAM.INFO.KV_tokensem_B", lone, false},
		{"$JS.API.STREAM.INFO.TOKENSEM__gate_A", lone, false}, // the gate is a semaphore of its own
		{"tokensem.B.tokens", lone, false},
		{"$JS.API.STREAM.NAMES", lone, false},
		{"$JS.API.STREAM.INFO.TOKENSEMG_G", k1, true},
		{"$JS.API.STREAM.MSG.DELETE.TOKENSEMG_G", k1, true},
		{"$JS.API.CONSUMER.INFO.TOKENSEMG_G.holders_k1", k1, true},
		{"$JS.API.CONSUMER.INFO.TOKENSEMG_G.holders_k2", k1, false},
		{"$JS.API.CONSUMER.INFO.TOKENSEMG_G.holders__gate_k1", k1, false},
		{"$JS.API.DIRECT.GET.KV_tokensemg_G.$KV.tokensemg_G.k1.lock", k1, true},
		{"$JS.API.DIRECT.GET.KV_tokensemg_G.$KV.tokensemg_G.k2.lock", k1, false},
		{"$JS.API.CONSUMER.CREATE.KV_tokensemg_G.x1.$KV.tokensemg_G.k1.slot.>", k1, true},
		{"$JS.API.CONSUMER.CREATE.KV_tokensemg_G.x1.$KV.tokensemg_G.k2.slot.>", k1, false},
		{"$JS.API.CONSUMER.CREATE.KV_tokensemg_G.x1.$KV.tokensemg_G.*.config", k1, true},
		{"$KV.tokensemg_G.k1.slot.3", k1, true},
		{"$KV.tokensemg_G.k2.slot.3", k1, false},
		{"$KV.tokensemg_G._generation", k1, true},
		{"tokensemg.G.k1.tokens", k1, true},
		{"tokensemg.G.k2.tokens", k1, false},
		{"$JS.API.STREAM.INFO.TOKENSEMG_G2", k1, false},
		{"$JS.API.STREAM.INFO.TOKENSEM_A", k1, false},
	} {
		if got := tc.lay.names(tc.subject); got != tc.want {
			t.Errorf("%s names %q = %v, want %v", tc.lay.stream+"/"+tc.lay.consumer, tc.subject, got, tc.want)
		}
	}
}

// TestParseRefusal: the two texts of a permissions violation, as nats.go
// wraps them, and errors that are not one.
func TestParseRefusal(t *testing.T) {
	viol := func(text string) error { return fmt.Errorf("%w: %s", nats.ErrPermissionViolation, text) }
	for _, tc := range []struct {
		name        string
		err         error
		op, subject string
	}{
		{"publish", viol(`Permissions Violation for Publish to "$JS.API.STREAM.INFO.KV_tokensem_B"`), "publish", "$JS.API.STREAM.INFO.KV_tokensem_B"},
		{"subscribe", viol(`Permissions Violation for Subscription to "_INBOX.abc.*"`), "subscribe", "_INBOX.abc.*"},
		{"subscribe with a queue", viol(`Permissions Violation for Subscription to "x.y" using queue "q"`), "subscribe", "x.y"},
		{"reply", viol(`Permissions Violation for Publish with Reply of "_R_.x"`), "", ""},
		{"not a violation", errors.New(`Permissions Violation for Publish to "x"`), "", ""},
	} {
		r, ok := parseRefusal(tc.err)
		if ok != (tc.op != "") || r.op != tc.op || r.subject != tc.subject {
			t.Errorf("%s: parseRefusal = %+v, %v; want %q %q", tc.name, r, ok, tc.op, tc.subject)
		}
		if ok && !errors.Is(refused("A", r), tokensem.ErrPermissionDenied) {
			t.Errorf("%s: the error does not match tokensem.ErrPermissionDenied", tc.name)
		}
	}
}

package amqpsem_test

import (
	"testing"

	"github.com/tokensem/tokensem/amqpsem"
)

// TestResourcesOf: the names ResourcesOf gives are those of the queues and
// the exchange Init made (passive declares fail on any other name).
func TestResourcesOf(t *testing.T) {
	n := name(t)
	initAMQP(t, n, 2)
	r := amqpsem.ResourcesOf(n)
	for _, q := range []string{r.Queue, r.ConfigQueue, r.ClaimPrefix + "0", r.ClaimPrefix + "1"} {
		if _, err := rawChannel(t).QueueDeclarePassive(q, true, false, false, false, nil); err != nil {
			t.Errorf("queue %s of ResourcesOf(%s): %v", q, n, err)
		}
	}
	if err := rawChannel(t).ExchangeDeclarePassive(r.Exchange, "direct", true, false, false, false, nil); err != nil {
		t.Errorf("exchange %s of ResourcesOf(%s): %v", r.Exchange, n, err)
	}
}

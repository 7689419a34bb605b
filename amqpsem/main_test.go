package amqpsem_test

import (
	"os"
	"testing"

	"github.com/tokensem/tokensem/internal/rabbittest"
	"github.com/tokensem/tokensem/internal/semtest"
)

// broker is the RabbitMQ every test in this package talks to.
var broker *rabbittest.Broker

func TestMain(m *testing.M) {
	os.Exit(semtest.Main(m, semtest.OnlyRabbit, func(b semtest.Brokers) { broker = b.Rabbit }))
}

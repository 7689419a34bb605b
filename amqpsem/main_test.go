package amqpsem_test

import (
	"os"
	"testing"

	"github.com/tokensem/tokensem/internal/rabbittest"
	"github.com/tokensem/tokensem/internal/testenv"
)

// broker is the RabbitMQ every test in this package talks to.
var broker *rabbittest.Broker

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, testenv.OnlyRabbit, func(b testenv.Brokers) { broker = b.Rabbit }))
}

package amqpsem_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/tokensem/tokensem/internal/rabbittest"
)

// broker is the RabbitMQ every test in this package talks to.
var broker *rabbittest.Broker

func TestMain(m *testing.M) {
	os.Exit(rabbittest.Main(func(b *rabbittest.Broker) int {
		broker = b
		code := m.Run()
		if code == 0 {
			if err := goleak.Find(); err != nil {
				os.Stderr.WriteString("leaked goroutines: " + err.Error() + "\n")
				return 1
			}
		}
		return code
	}))
}

package natssem_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/tokensem/tokensem/natssem/embedded"
)

// srv is the embedded NATS server every test in this package talks to.
var srv *embedded.Server

func TestMain(m *testing.M) {
	var err error
	srv, err = embedded.Start(embedded.Config{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "embedded nats:", err)
		os.Exit(1)
	}
	code := m.Run()
	srv.Shutdown()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "leaked goroutines:", err)
			code = 1
		}
	}
	os.Exit(code)
}

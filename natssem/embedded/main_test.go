package embedded_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("leaked goroutines: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

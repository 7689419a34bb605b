package tokensem_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a goroutine behind: Do
// starts one per call.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

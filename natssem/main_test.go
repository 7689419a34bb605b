package natssem_test

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/tokensem/tokensem/internal/natstest"
	"github.com/tokensem/tokensem/internal/testenv"
	"github.com/tokensem/tokensem/natssem/embedded"
)

// srv is the embedded NATS server most tests in this package talk to.
var srv *embedded.Server

// The 3-node cluster of the tests that need one, started by the first of
// them (see cluster) and shut down by TestMain.
var (
	clusterOnce sync.Once
	clusterSrv  *natstest.Cluster
	clusterErr  error
	clusterDir  string
)

// cluster returns the package's 3-node JetStream cluster, starting it on
// first use. Tests that stop a node must bring it back before they end.
func cluster(t testing.TB) *natstest.Cluster {
	t.Helper()
	clusterOnce.Do(func() {
		if clusterDir, clusterErr = os.MkdirTemp("", "natssem-cluster-*"); clusterErr != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		clusterSrv, clusterErr = natstest.StartProcessCluster(ctx, 3, clusterDir)
	})
	if clusterErr != nil {
		t.Fatalf("3-node cluster: %v", clusterErr)
	}
	return clusterSrv
}

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, testenv.NATS, func(b testenv.Brokers) { srv = b.NATS }, func() {
		if clusterSrv != nil {
			clusterSrv.Shutdown()
		}
		if clusterDir != "" {
			_ = os.RemoveAll(clusterDir)
		}
		natstest.RemoveBinaries()
	}))
}

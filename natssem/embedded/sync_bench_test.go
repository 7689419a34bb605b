package embedded_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem/internal/benchtest"
	"github.com/tokensem/tokensem/natssem"
	"github.com/tokensem/tokensem/natssem/embedded"
)

// BenchmarkSync measures what each SyncPolicy costs on this machine, on a
// kept store: a JetStream publish until its ack, a KV update (a
// compare-and-set) and a natssem Acquire+Release, on one server (R1) and
// on a 3-node cluster in this process (R3). The figures are quoted in
// Config.Sync's documentation.
//
//	go test -run '^$' -bench Sync -benchtime 2s ./natssem/embedded/
func BenchmarkSync(b *testing.B) {
	for _, sync := range []embedded.SyncPolicy{embedded.SyncAlways, embedded.SyncInterval} {
		b.Run(fmt.Sprintf("R1/%v", sync), func(b *testing.B) {
			s, err := embedded.Start(embedded.Config{StoreDir: b.TempDir(), Sync: sync})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(s.Shutdown)
			benchWrites(b, s.URL(), 1)
		})
		b.Run(fmt.Sprintf("R3/%v", sync), func(b *testing.B) {
			benchWrites(b, startCluster(b, 3, sync)[0].URL(), 3)
		})
	}
}

// benchWrites runs the three measurements against the server at url,
// with streams of the given replicas.
func benchWrites(b *testing.B, url string, replicas int) {
	ctx := context.Background()
	nc, err := nats.Connect(url)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("publish", func(b *testing.B) {
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "BENCH", Subjects: []string{"bench"},
			Storage: jetstream.FileStorage, Replicas: replicas}); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if _, err := js.Publish(ctx, "bench", []byte("token")); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("kv-update", func(b *testing.B) {
		kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "bench", History: 1,
			Storage: jetstream.FileStorage, Replicas: replicas})
		if err != nil {
			b.Fatal(err)
		}
		rev, err := kv.Put(ctx, "k", []byte("v"))
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for b.Loop() {
			n++
			if rev, err = kv.Update(ctx, "k", []byte("v"), rev); err != nil {
				e, _ := kv.Get(ctx, "k")
				b.Fatalf("update %d at rev %d: %v (now %d)", n, rev, err, e.Revision())
			}
		}
	})
	b.Run("acquire-release", func(b *testing.B) {
		s, err := natssem.Init(ctx, nc, "bench", 1, natssem.WithReplicas(replicas))
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		benchtest.BenchCycle(b, s)
	})
}

package natssem_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/semtest"
	"github.com/tokensem/tokensem/natssem"
)

// conns maps each semaphore a test opened to its connection, for Crash.
var conns sync.Map

func connect(t testing.TB, addr string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect("nats://"+addr, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatalf("connect %s: %v", addr, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func natsOptions(o semtest.Options) []natssem.Option {
	var opts []natssem.Option
	if o.Lease != 0 {
		opts = append(opts, natssem.WithLease(o.Lease))
	}
	if o.Key != nil {
		opts = append(opts, natssem.WithKey(o.Key))
	}
	return opts
}

func natsBackend() semtest.Backend {
	return semtest.Backend{
		Name: "nats",
		Addr: srv.Addr().String(),
		Init: func(t testing.TB, addr, name string, permits int, o semtest.Options) (tokensem.Semaphore, error) {
			nc := connect(t, addr)
			s, err := natssem.Init(t.Context(), nc, name, permits, natsOptions(o)...)
			if err != nil {
				return nil, err
			}
			conns.Store(s, nc)
			return s, nil
		},
		Open: func(t testing.TB, addr, name string, o semtest.Options) (tokensem.Semaphore, error) {
			nc := connect(t, addr)
			s, err := natssem.Open(t.Context(), nc, name, natsOptions(o)...)
			if err != nil {
				return nil, err
			}
			conns.Store(s, nc)
			return s, nil
		},
		InjectRaw: func(t testing.TB, name string, data []byte) {
			t.Helper()
			nc := connect(t, srv.Addr().String())
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			if _, err := js.Publish(ctx, natssem.Subject(name), data); err != nil {
				t.Fatalf("inject into %s: %v", name, err)
			}
		},
		Crash: func(t testing.TB, s tokensem.Semaphore) {
			nc, ok := conns.Load(s)
			if !ok {
				t.Fatal("crash: unknown semaphore")
			}
			nc.(*nats.Conn).Close()
		},
	}
}

func TestConformance(t *testing.T) {
	semtest.Run(t, natsBackend())
}

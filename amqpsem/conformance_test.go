package amqpsem_test

import (
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/amqpsem"
	"github.com/tokensem/tokensem/driver"
	"github.com/tokensem/tokensem/internal/semopts"
	"github.com/tokensem/tokensem/internal/semtest"
)

// conns maps each semaphore a test opened to its connection, for Crash;
// leases maps a semaphore name to the lease its Init asked for, which this
// backend turns into the heartbeat of every client of that semaphore.
var conns, leases sync.Map

func leaseOf(name string, o semtest.Options) time.Duration {
	if o.Lease != 0 {
		return o.Lease
	}
	if l, ok := leases.Load(name); ok {
		return l.(time.Duration)
	}
	return 0
}

// dial connects to the broker at addr. The suite's lease maps to the
// heartbeat: RabbitMQ drops a silent client after about two heartbeats.
func dial(t testing.TB, addr string, lease time.Duration) *amqpsem.Conn {
	t.Helper()
	hb := max(time.Second, (lease / 2).Truncate(time.Second))
	if lease == 0 {
		hb = amqpsem.DefaultHeartbeat
	}
	c, err := amqpsem.Dial(t.Context(), broker.URLVia(addr), amqpsem.WithHeartbeat(hb))
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func amqpOptions(o semtest.Options) []amqpsem.Option {
	var opts []amqpsem.Option
	if o.Key != nil {
		opts = append(opts, amqpsem.WithKey(o.Key))
	}
	if o.Logger != nil {
		opts = append(opts, amqpsem.WithLogger(o.Logger))
	}
	if o.Observer != nil {
		opts = append(opts, amqpsem.WithObserver(o.Observer))
	}
	return opts
}

func amqpBackend() semtest.Backend {
	return semtest.Backend{
		Name: "amqp",
		Addr: broker.Addr,
		Init: func(t testing.TB, addr, name string, permits int, o semtest.Options) (tokensem.Semaphore, error) {
			if o.Lease != 0 && o.Lease < tokensem.MinLease {
				return nil, semopts.CheckLease(o.Lease)
			}
			leases.Store(name, o.Lease)
			c := dial(t, addr, o.Lease)
			s, err := amqpsem.Init(t.Context(), c, name, permits, amqpOptions(o)...)
			if err != nil {
				return nil, err
			}
			conns.Store(s, c)
			return s, nil
		},
		Open: func(t testing.TB, addr, name string, o semtest.Options) (tokensem.Semaphore, error) {
			c := dial(t, addr, leaseOf(name, o))
			s, err := amqpsem.Open(t.Context(), c, name, amqpOptions(o)...)
			if err != nil {
				return nil, err
			}
			conns.Store(s, c)
			return s, nil
		},
		InjectRaw: func(t testing.TB, name string, data []byte) {
			t.Helper()
			conn, err := amqp.Dial(broker.URL)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ch, err := conn.Channel()
			if err != nil {
				t.Fatal(err)
			}
			if err := ch.Confirm(false); err != nil {
				t.Fatal(err)
			}
			dc, err := ch.PublishWithDeferredConfirmWithContext(t.Context(), "", amqpsem.ResourcesOf(name).Queue, true, false,
				amqp.Publishing{DeliveryMode: amqp.Persistent, Body: data})
			if err != nil {
				t.Fatal(err)
			}
			if ok, err := dc.WaitContext(t.Context()); !ok || err != nil {
				t.Fatalf("inject into %s: confirmed %v, %v", name, ok, err)
			}
		},
		Crash: func(t testing.TB, s tokensem.Semaphore) {
			c, ok := conns.Load(s)
			if !ok {
				t.Fatal("crash: unknown semaphore")
			}
			_ = c.(*amqpsem.Conn).Close()
		},
		Inventory: func(s tokensem.Semaphore) driver.Inventory { return s.(*amqpsem.Semaphore).Inventory() },
		Delete: func(t testing.TB, name string, force bool) error {
			c, err := amqpsem.Dial(semtest.CleanupContext(t, time.Minute), broker.URL)
			if err != nil {
				return err
			}
			defer c.Close()
			if force {
				return amqpsem.ForceDelete(semtest.CleanupContext(t, time.Minute), c, name)
			}
			return amqpsem.Delete(semtest.CleanupContext(t, time.Minute), c, name)
		},
		List: func(t testing.TB) ([]tokensem.Info, error) {
			c, err := amqpsem.Dial(semtest.Context(t, time.Minute), broker.URL)
			if err != nil {
				return nil, err
			}
			defer c.Close()
			return amqpsem.List(semtest.Context(t, time.Minute), c)
		},
		ReplaceConfig: replaceConfig,
	}
}

// replaceConfig replaces the one message of semaphore name's
// configuration queue with edit of it, as a client allowed to read and
// write that queue could.
func replaceConfig(t testing.TB, name string, edit func([]byte) []byte) {
	t.Helper()
	conn, err := amqp.Dial(broker.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	q := "tokensem." + name + ".cfg"
	// A client reading the configuration holds its one message for a
	// moment (a handle reads it ahead in the background, too): take it
	// once it is back.
	var d amqp.Delivery
	for deadline := time.Now().Add(10 * time.Second); ; {
		var ok bool
		d, ok, err = ch.Get(q, false)
		if err != nil {
			t.Fatalf("take the configuration of %s: %v", name, err)
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("take the configuration of %s: its queue stayed empty for 10 s", name)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := ch.Tx(); err != nil {
		t.Fatal(err)
	}
	if err := ch.PublishWithContext(t.Context(), "", q, true, false, amqp.Publishing{DeliveryMode: amqp.Persistent, Body: edit(d.Body)}); err != nil {
		t.Fatal(err)
	}
	if err := d.Ack(false); err != nil {
		t.Fatal(err)
	}
	if err := ch.TxCommit(); err != nil {
		t.Fatalf("replace the configuration of %s: %v", name, err)
	}
}

// TestConformanceAlone runs the suite's cases that measure the process's
// allocations, in the package's serial phase.
func TestConformanceAlone(t *testing.T) { semtest.RunAlone(t, amqpBackend()) }

// TestConformance runs the rest of the suite beside the package's other
// parallel tests: its cases wait on the broker far more than they compute.
func TestConformance(t *testing.T) {
	t.Parallel()
	semtest.RunBeside(t, amqpBackend())
}

package amqpsem_test

import (
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/amqpsem"
	"github.com/tokensem/tokensem/driver"
	"github.com/tokensem/tokensem/internal/faultproxy"
	"github.com/tokensem/tokensem/internal/semtest"
)

// rawChannel opens a plain amqp091 channel on the test broker.
func rawChannel(t *testing.T) *amqp.Channel { return defaultPlace().channel(t) }

// configMessages counts the messages of a semaphore's configuration queue
// once nobody reads it: the broker's count lags a requeue by a few
// milliseconds, so it polls (briefly) while the count is 0.
func configMessages(t *testing.T, name string) int {
	t.Helper()
	ch := rawChannel(t)
	deadline := time.Now().Add(2 * time.Second)
	for {
		q, err := ch.QueueDeclarePassive("tokensem."+name+".cfg", true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if q.Messages != 0 || time.Now().After(deadline) {
			return q.Messages
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestConfigExistsOnce: concurrent resizes and reads leave exactly one
// configuration message, the newest.
func TestConfigExistsOnce(t *testing.T) {
	t.Parallel()
	n := name(t)
	initAMQP(t, n, 2)
	// 20 resizes and censuses, one at a time under the creation lock:
	// about 20 s beside the package's other tests, 65 s once on a loaded
	// CI machine (two hogs and every package at once).
	ctx := semtest.Context(t, 3*time.Minute)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 4 {
		s, err := amqpsem.Open(ctx, dial(t, broker.Addr, 0), n)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		wg.Go(func() {
			for r := range 5 {
				if _, err := s.Resize(ctx, 2+(i+r)%3); err != nil {
					errs <- err
					return
				}
				if _, err := s.Status(ctx); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := configMessages(t, n); got != 1 {
		t.Fatalf("%d configuration messages after concurrent resizes, want 1", got)
	}
	s, err := amqpsem.Open(ctx, dial(t, broker.Addr, 0), n)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	final := s.Permits()
	if _, err := s.Resize(ctx, 7); err != nil {
		t.Fatal(err)
	}
	o, err := amqpsem.Open(ctx, dial(t, broker.Addr, 0), n)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if o.Permits() != 7 {
		t.Fatalf("a fresh Open reads %d permits after a resize from %d to 7", o.Permits(), final)
	}
}

// TestInitResumesDeadCreation: a creator died after writing the
// configuration as "creating" and some tokens. Open refuses the semaphore;
// the next Init starts the creation over and leaves exactly N tokens.
func TestInitResumesDeadCreation(t *testing.T) {
	t.Parallel()
	n := name(t)
	ch := rawChannel(t)
	cfgQ := "tokensem." + n + ".cfg"
	if _, err := ch.QueueDeclare(cfgQ, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	cfg, _ := json.Marshal(map[string]any{"v": 1, "seq": 1, "state": "creating", "permits": 5, "epoch": 1, "queue_type": "quorum", "created_unix_ms": 1,
		"hold_bound_ms": 7500})
	if err := ch.Publish("", cfgQ, false, false, amqp.Publishing{DeliveryMode: amqp.Persistent, Body: cfg}); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("tokensem."+n, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	b, _ := driver.NewCodec(nil).Encode(driver.NewToken(n, 0, 1))
	if err := ch.Publish("", "tokensem."+n, false, false, amqp.Publishing{DeliveryMode: amqp.Persistent, Body: b}); err != nil {
		t.Fatal(err)
	}

	ctx := semtest.Context(t, time.Minute)
	if _, err := amqpsem.Open(ctx, dial(t, broker.Addr, 0), n); !errors.Is(err, tokensem.ErrNotInitialized) {
		t.Fatalf("open of a creation that died: %v, want ErrNotInitialized", err)
	}
	s, err := amqpsem.Init(ctx, dial(t, broker.Addr, 0), n, 3)
	if err != nil {
		t.Fatalf("init over a creation that died: %v", err)
	}
	defer s.Close()
	st, err := s.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Permits != 3 || st.Tokens != 3 || !st.Healthy {
		t.Fatalf("status after Init resumed a dead creation: %+v", st)
	}
	if got := configMessages(t, n); got != 1 {
		t.Fatalf("%d configuration messages, want 1", got)
	}
}

// TestDeletedExchangeMadeAgain: every write declares and binds the
// semaphore's exchange again (see bind), so one an operator deleted, with
// its bindings, comes back with the next write: a resize from 1 to 2
// writes the configuration and issues the new token through it.
func TestDeletedExchangeMadeAgain(t *testing.T) {
	t.Parallel()
	n := name(t)
	s := initAMQP(t, n, 1)
	if err := rawChannel(t).ExchangeDelete("tokensem."+n+".x", false, false); err != nil {
		t.Fatal(err)
	}
	ctx := semtest.Context(t, time.Minute)
	if _, err := s.Resize(ctx, 2); err != nil {
		t.Fatalf("resize with the exchange deleted: %v", err)
	}
	st, err := s.Status(ctx)
	if err != nil || !st.Healthy || st.Permits != 2 || st.Tokens != 2 {
		t.Fatalf("status after the resize: %+v, %v; want 2 permits, 2 tokens, healthy", st, err)
	}
	if err := rawChannel(t).ExchangeDeclarePassive("tokensem."+n+".x", amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
		t.Fatalf("the exchange after the resize: %v", err)
	}
}

// TestSilentBrokerOpenIsUnavailable: a broker that does not open a channel
// within a configuration read's window makes Open fail with an error
// wrapping tokensem.ErrUnavailable (transient: the CLI retries it), not a
// bare "context deadline exceeded" while the caller's context is alive.
// (A 60 MB publish once held RabbitMQ up that long on a loaded machine.)
func TestSilentBrokerOpenIsUnavailable(t *testing.T) {
	t.Parallel()
	n := name(t)
	initAMQP(t, n, 1)
	px, err := faultproxy.New(broker.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	c := dial(t, px.Addr(), 0)
	px.Pause()
	defer px.Resume()
	ctx := semtest.Context(t, time.Minute)
	_, err = amqpsem.Open(ctx, c, n, amqpsem.WithRequestTimeout(200*time.Millisecond))
	if ctx.Err() != nil {
		t.Fatalf("open outlived its caller's minute: %v", err)
	}
	if !errors.Is(err, tokensem.ErrUnavailable) {
		t.Fatalf("open through a silent broker: %v, want an error wrapping ErrUnavailable", err)
	}
	t.Logf("open through a silent broker: %v", err)
}

// TestSecondConfigMessageRefused: a second message in a semaphore's
// configuration queue (published by its admin; no writer of amqpsem leaves
// one) makes reads refuse the configuration as an invalid record, not pick
// one of the two: a reader is handed both (prefetch 2) and sees the second,
// which reaches it along with the first, unless its machine is too loaded
// to take it within the moment it waits (then it reads the first, and a
// later read finds the second). A writer always finds it: its basic.get
// counts the message behind the one it takes.
func TestSecondConfigMessageRefused(t *testing.T) {
	t.Parallel()
	n := name(t)
	made := initAMQP(t, n, 1) // opened before the second message came
	if !defaultPlace().publishConfig(t, n, []byte(`{"junk":true}`)) {
		t.Fatal("the broker did not confirm the second message")
	}
	c := dial(t, broker.Addr, 0)
	refused := 0
	for i := range 20 {
		s, err := amqpsem.Open(t.Context(), c, n)
		if err == nil {
			// Missed under load: what it read is the first message.
			if s.Permits() != 1 {
				t.Errorf("open %d read %d permits, want the first message's 1", i+1, s.Permits())
			}
			s.Close()
			continue
		}
		if !errors.Is(err, tokensem.ErrInvalidRecord) || !strings.Contains(err.Error(), "more than one message") {
			t.Fatalf("open %d with two configuration messages: %v; want an invalid record naming the second message", i+1, err)
		}
		refused++
	}
	t.Logf("%d of 20 opens refused the configuration", refused)
	if refused == 0 {
		t.Fatal("no open of 20 saw the second configuration message")
	}
	if _, err := made.Resize(t.Context(), 2); !errors.Is(err, tokensem.ErrInvalidRecord) {
		t.Fatalf("resize with two configuration messages: %v; want an invalid record", err)
	}
	if err := amqpsem.ForceDelete(t.Context(), c, n); err != nil {
		t.Fatalf("ForceDelete of a semaphore with two configuration messages: %v", err)
	}
}

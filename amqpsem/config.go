package amqpsem

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem"
)

// config is the semaphore's definition. It is stored as configCopies
// identical persistent messages in the classic queue tokensem.NAME.config.
// A reader takes one copy with basic.get and requeues it at once, so any
// client can read it without consuming it, and a few can read at the same
// instant. (A stream queue would also serve, but every stream holds files
// open on the broker: a few hundred semaphores exhausted RabbitMQ's default
// 1024 descriptors on our test machine and wedged it.)
type config struct {
	Version   int    `json:"v"`
	Seq       int    `json:"seq"`
	Permits   int    `json:"permits"`
	Epoch     uint64 `json:"epoch"`
	KeyCheck  string `json:"key_check,omitempty"`
	QueueType string `json:"queue_type"`
	Created   int64  `json:"created_unix_ms"`
	// FenceGen counts the reconcile runs that issued tokens. A token
	// issued by run g carries the fence base g<<fenceGenShift, above every
	// fence the slot's earlier tokens gave (each is its base plus its
	// delivery count, far below 2^fenceGenShift).
	FenceGen uint64 `json:"fence_gen,omitempty"`
}

const (
	configVersion = 1
	// configCopies is how many readers can hold a copy at the same instant
	// before the next one has to retry.
	configCopies = 8
)

var configQueueArgs = amqp.Table{"x-queue-type": "classic"}

// writeConfig replaces the stored configuration, under the creation lock.
// ch must be in confirm mode.
func (s *Semaphore) writeConfig(ctx context.Context, ch *amqp.Channel, cfg config) error {
	b, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	q := configQueue(s.name)
	err = rpc(ctx, ch, func() error {
		if _, err := ch.QueueDeclare(q, true, false, false, false, configQueueArgs); err != nil {
			return err
		}
		_, err := ch.QueuePurge(q, false)
		return err
	})
	if err != nil {
		return wrapBrokerErr("config queue of "+s.name, err)
	}
	pending := make([]*amqp.DeferredConfirmation, 0, configCopies)
	for range configCopies {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, true, false, amqp.Publishing{
			DeliveryMode: amqp.Persistent, ContentType: "application/json", Body: b,
		})
		if err != nil {
			return wrapBrokerErr("publish config", err)
		}
		pending = append(pending, dc)
	}
	return s.c.waitConfirms(ctx, pending)
}

// readConfig reads the stored configuration. An empty config queue means
// either that every copy is being read at this instant or that creation has
// not finished; it is retried for a moment before the semaphore counts as
// not initialized.
func (s *Semaphore) readConfig(ctx context.Context) (config, error) {
	pause := 2 * time.Millisecond
	for attempt := 0; ; attempt++ {
		cfg, found, err := s.readConfigOnce(ctx)
		if err != nil || found {
			return cfg, err
		}
		if attempt == 10 {
			return config{}, fmt.Errorf("%w: %s has no configuration yet", tokensem.ErrNotInitialized, s.name)
		}
		if err := sleepCtx(ctx, pause); err != nil {
			return config{}, err
		}
		pause = min(2*pause, 50*time.Millisecond)
	}
}

func (s *Semaphore) readConfigOnce(ctx context.Context) (cfg config, found bool, err error) {
	ch, _, err := s.c.channel(ctx)
	if err != nil {
		return config{}, false, err
	}
	defer ch.Close()
	rctx, cancel := s.rtt(ctx)
	defer cancel()
	var d amqp.Delivery
	var ok bool
	err = rpc(rctx, ch, func() (err error) {
		d, ok, err = ch.Get(configQueue(s.name), false)
		return err
	})
	switch {
	case isCode(err, amqp.NotFound):
		return config{}, false, fmt.Errorf("%w: %s", tokensem.ErrNotInitialized, s.name)
	case err != nil:
		return config{}, false, wrapBrokerErr("read config of "+s.name, err)
	case !ok:
		return config{}, false, nil
	}
	_ = d.Reject(true)
	if err := json.Unmarshal(d.Body, &cfg); err != nil || cfg.Version != configVersion || cfg.Permits <= 0 {
		return config{}, false, fmt.Errorf("amqpsem: corrupt configuration of %s: %q", s.name, d.Body)
	}
	return cfg, true, nil
}

package amqpsem

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem"
)

// create makes the semaphore, under the creation lock: first its
// configuration, marked as being created, then the token queue and its
// tokens, and then the configuration marked ready. Until then nobody can
// open the semaphore, so a creation that died half-way (prev, its
// configuration) is started over: its token queue is purged first.
func (s *Semaphore) create(ctx context.Context, permits int, prev *config) (config, error) {
	ch, sess, err := s.c.channel(ctx)
	if err != nil {
		return config{}, err
	}
	defer ch.Close()
	cfg := config{Version: configVersion, Seq: 1, State: stateCreating, Permits: permits, Epoch: 1,
		KeyCheck: s.codec.KeyCheck(), QueueType: s.opts.queueType, Created: time.Now().UnixMilli()}
	// Registered first: every semaphore that exists has an entry (see
	// registry.go).
	if err := s.register(ctx, sess.version); err != nil {
		return config{}, err
	}
	if prev == nil {
		err = s.createConfig(ctx, cfg, sess.version)
	} else {
		cfg.Seq = prev.Seq + 1
		err = s.writeConfig(ctx, cfg)
	}
	if err != nil {
		return config{}, err
	}
	q := QueueName(s.name)
	err = s.c.rpc(ctx, ch, func() error {
		if _, err := ch.QueueDeclare(q, true, false, false, false, tokenQueueArgs(s.opts.queueType, sess.version)); err != nil {
			if isCode(err, amqp.PreconditionFailed) {
				return fmt.Errorf("queue %s exists with other settings: %w", q, err)
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err // abandoned: the lock may have passed to another Init
		}
		if _, err := ch.QueuePurge(q, false); err != nil {
			return err
		}
		return ch.Confirm(false)
	}, nil)
	if err != nil {
		return config{}, wrapBrokerErr("create "+q, err)
	}
	const batch = 1000
	for lo := 0; lo < permits; lo += batch {
		var pending []*amqp.DeferredConfirmation
		for i := lo; i < min(lo+batch, permits); i++ {
			tok := tokensem.NewToken(s.name, i, cfg.Epoch)
			b, err := s.codec.Encode(tok)
			if err != nil {
				return config{}, err
			}
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, true, false, amqp.Publishing{
				DeliveryMode: amqp.Persistent, ContentType: "text/plain", MessageId: tok.ID, Body: b,
			})
			if err != nil {
				return config{}, wrapBrokerErr("publish token", err)
			}
			pending = append(pending, dc)
		}
		if err := s.c.waitConfirms(ctx, pending); err != nil {
			return config{}, err
		}
	}
	cfg.State, cfg.Seq = stateReady, cfg.Seq+1
	if err := s.writeConfig(ctx, cfg); err != nil {
		return config{}, err
	}
	s.log.Info("semaphore created", "permits", permits, "queue_type", cfg.QueueType, "server", sess.version)
	return cfg, nil
}

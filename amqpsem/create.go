package amqpsem

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/driver"
	"github.com/tokensem/tokensem/internal/ids"
)

// create makes the semaphore, under the creation lock: first its
// configuration, marked as being created, then the claim queues of its
// slots, the token queue and its tokens, and then the configuration marked
// ready. Until then nobody can open the semaphore, so a creation that died
// half-way (prev, its configuration) is started over: its token queue is
// purged first.
//
// Each creation is a new life of the name: a new random epoch, which its
// tokens carry, and a fence base above after (the highest base of an
// earlier life that is known, 0 if none) and, by the clock, above every
// fence of earlier lives (see nextFenceBase).
//
// The claim queues are made here, before any token exists, so that a
// claim queue that is missing later is one that went away (its node
// restarted or was lost, see claimSlot), not one never used.
func (s *Semaphore) create(ctx context.Context, permits int, prev *config, after uint64) (config, error) {
	ch, sess, err := s.c.channel(ctx)
	if err != nil {
		return config{}, err
	}
	defer ch.Close()
	bound, err := s.creationHoldBound(ctx)
	if err != nil {
		return config{}, err
	}
	if prev != nil {
		after = max(after, prev.maxFenceBase())
	}
	cfg := config{Version: configVersion, Seq: 1, State: stateCreating, Permits: permits, Epoch: ids.Epoch(),
		KeyCheck: s.codec.KeyCheck(), QueueType: s.opts.queueType, Created: time.Now().UnixMilli(),
		HoldBoundMS: bound.Milliseconds(), FenceBase: nextFenceBase(after), Issued: permits}
	// Registered first: every semaphore that exists has an entry (see
	// list.go).
	if err := s.register(ctx); err != nil {
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
	if err := s.declareClaims(ctx, ch, 0, permits); err != nil {
		return config{}, err
	}
	q := tokenQueue(s.name)
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
		if err := s.bind(ch, q); err != nil {
			return err
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
			tok := driver.NewToken(s.name, i, cfg.Epoch)
			b, err := s.codec.Encode(tok)
			if err != nil {
				return config{}, err
			}
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchangeName(s.name), q, true, false, amqp.Publishing{
				DeliveryMode: amqp.Persistent, ContentType: "text/plain", MessageId: tok.ID, Body: b,
			})
			if err != nil {
				return config{}, wrapBrokerErr("publish token", err)
			}
			pending = append(pending, dc)
		}
		if err := s.c.waitConfirms(ctx, ch, pending); err != nil {
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

// declareClaims declares the claim queues of slots [from, to) on ch, in
// one go (no wait for each; a last round trip confirms them all).
func (s *Semaphore) declareClaims(ctx context.Context, ch *channel, from, to int) error {
	if from >= to {
		return nil
	}
	err := s.c.rpc(ctx, ch, func() error {
		for i := from; i < to; i++ {
			if _, err := ch.QueueDeclare(claimQueue(s.name, i), false, false, false, true, nil); err != nil {
				return err
			}
			if err := ctx.Err(); err != nil {
				return err // abandoned: the lock may have passed to another
			}
		}
		// The broker runs a channel's commands in order: its answer to
		// this one says every declare before it succeeded.
		_, err := ch.QueueDeclarePassive(claimQueue(s.name, to-1), false, false, false, false, nil)
		return err
	}, nil)
	return wrapBrokerErr("declare the claim queues", err)
}

// creationHoldBound returns W for a semaphore made now: the bound of this
// client's Conn, and for a gate (see AcquireN), at least its semaphore's,
// so that every client that may open the semaphore may open its gate.
func (s *Semaphore) creationHoldBound(ctx context.Context) (time.Duration, error) {
	bound := s.c.holdBound()
	if !driver.IsGate(s.name) {
		return bound, nil
	}
	parent := newSemaphoreWith(s.c, strings.TrimPrefix(s.name, driver.GateName("")), s.opts)
	defer parent.Close()
	cfg, err := parent.loadConfig(ctx)
	switch {
	case errors.Is(err, tokensem.ErrNotInitialized):
		return bound, nil
	case err != nil:
		return 0, err
	}
	return max(bound, cfg.holdBound()), nil
}

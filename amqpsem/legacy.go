package amqpsem

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/backoff"
)

// legacyConfigQueue is where an older amqpsem kept the configuration: a
// classic queue of identical copies, on one node.
func legacyConfigQueue(name string) string { return "tokensem." + name + ".config" }

// migrate moves the configuration of a semaphore made by an older amqpsem
// from its classic queue (which lives on one node) into the replicated
// configuration queue, under the creation lock, and returns it. The classic
// queue is left as it was, for clients of the older version still running;
// delete it once none is.
func (s *Semaphore) migrate(ctx context.Context) (config, error) {
	ctx, unlock, err := s.lock(ctx)
	if err != nil {
		return config{}, err
	}
	defer unlock()
	return s.migrateLocked(ctx)
}

// migrateLocked is migrate under a lock the caller holds.
func (s *Semaphore) migrateLocked(ctx context.Context) (config, error) {
	if cfg, err := s.loadConfig(ctx); !errors.Is(err, errLegacyLayout) {
		return cfg, err // migrated meanwhile, or gone
	}
	cfg, err := s.readLegacyConfig(ctx)
	if err != nil {
		return config{}, err
	}
	cfg.Seq++
	cfg.State = stateReady
	ch, sess, err := s.c.channel(ctx)
	if err != nil {
		return config{}, err
	}
	version := sess.version
	_ = ch.Close()
	if err := s.createConfig(ctx, cfg, version); err != nil {
		return config{}, err
	}
	s.log.Warn("moved the configuration from the classic queue of an older amqpsem to a replicated one; delete the classic queue once no older client runs",
		"from", legacyConfigQueue(s.name), "to", configQueue(s.name))
	return cfg, nil
}

// readLegacyConfig reads the classic layout's configuration: it takes every
// copy, keeps the newest and requeues them all.
func (s *Semaphore) readLegacyConfig(ctx context.Context) (config, error) {
	rctx, cancel := context.WithTimeout(ctx, s.configRetry())
	defer cancel()
	pause := backoff.Backoff{Min: 2 * time.Millisecond, Max: 50 * time.Millisecond}
	for {
		ch, _, err := s.c.channel(rctx)
		if err != nil {
			return config{}, err
		}
		var newest config
		found := false
		err = s.c.rpc(rctx, ch, func() error {
			for {
				d, ok, err := ch.Get(legacyConfigQueue(s.name), false)
				if err != nil || !ok {
					return err
				}
				cfg, err := decodeConfig(s.name, d.Body)
				if err != nil {
					return err
				}
				if !found || cfg.Seq > newest.Seq {
					newest, found = cfg, true
				}
			}
		}, nil)
		_ = ch.Close() // requeues every copy taken
		switch {
		case errors.Is(err, tokensem.ErrInvalidRecord):
			return config{}, err
		case err != nil && isHomeNodeDown(err):
			return config{}, wrapBrokerErr("the configuration of "+s.name, err)
		case err != nil && isCode(err, amqp.NotFound):
			return config{}, fmt.Errorf("%w: %s", tokensem.ErrNotInitialized, s.name)
		case err != nil:
			return config{}, wrapBrokerErr("the configuration of "+s.name, err)
		case found:
			return newest, nil
		}
		if pause.Wait(rctx, nil) != nil {
			return config{}, wrapBrokerErr("the configuration of "+s.name, errors.New("its classic queue stayed empty"))
		}
	}
}

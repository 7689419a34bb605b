package amqpsem

import (
	"context"
	"fmt"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/adaptive"
)

// RecordController stores r, the record of the controller that leads this
// semaphore's count (package adaptive, seminit adapt), in the semaphore's
// configuration, in place of the last one; ControllerRecord reads it back
// and seminit status shows it. It is informational: nothing admits or
// resizes by it. Writing it takes the creation lock and the rights to
// write the configuration (an admin's, see docs/permissions-rabbitmq.md).
//
// Errors: tokensem.ErrInvalidOption (r fails adaptive.Record.Check),
// tokensem.ErrClosed, tokensem.ErrNotInitialized, tokensem.ErrPermissionDenied,
// or a wrapped broker error.
func (s *Semaphore) RecordController(ctx context.Context, r adaptive.Record) error {
	b, err := adaptive.EncodeRecord(r)
	if err != nil {
		return err
	}
	epoch := s.config().Epoch
	_, err = s.updateConfig(ctx, func(cfg *config) (bool, error) {
		if cfg.Epoch != epoch { // deleted, and made again since this handle opened
			return false, fmt.Errorf("%w: %s was deleted (and made again)", tokensem.ErrNotInitialized, s.name)
		}
		cfg.Controller = b
		return true, nil
	})
	return err
}

// ControllerRecord returns the record the semaphore's controller stored
// last (see RecordController); ok is false when none has in this life of
// the semaphore.
//
// Errors: tokensem.ErrInvalidRecord (a record RecordController would not
// have written), tokensem.ErrClosed, tokensem.ErrNotInitialized, or a
// wrapped broker error.
func (s *Semaphore) ControllerRecord(ctx context.Context) (r adaptive.Record, ok bool, err error) {
	if s.isClosed() {
		return r, false, tokensem.ErrClosed
	}
	cfg, err := s.readConfig(ctx)
	switch {
	case err != nil:
		return r, false, err
	case cfg.ctlErr != nil:
		return r, false, fmt.Errorf("amqpsem: the controller record of %s: %w", s.name, cfg.ctlErr)
	case len(cfg.Controller) == 0 || cfg.Epoch != s.config().Epoch:
		return r, false, nil
	}
	return cfg.ctl, true, nil // checked as it was read (canonicalController)
}

package amqpsem

import (
	"context"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/reconciler"
)

// Resize changes the number of permits, under the creation lock, and
// repairs the token set to match (see reconciler.Run): growing issues tokens
// for the new slots; shrinking removes the ready tokens of slots >=
// permits, while their holders keep their permits until they release
// (their tokens are then retired by the next acquirer). Every client admits
// by the new count within 2 s, so admission never exceeds max(old,
// new) and converges to the new count.
//
// Errors: tokensem.ErrInvalidPermits, tokensem.ErrClosed, or a wrapped
// broker error.
func (s *Semaphore) Resize(ctx context.Context, permits int) (reconciler.Report, error) {
	return reconciler.Resize(ctx, s.Inventory(), permits, s.writePermits)
}

func (s *Semaphore) writePermits(ctx context.Context, permits int) error {
	if s.isClosed() {
		return tokensem.ErrClosed
	}
	ctx, unlock, err := s.lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	cfg, err := s.readConfig(ctx)
	if err != nil {
		return err
	}
	if cfg.Permits == permits {
		return nil
	}
	old := cfg.Permits
	cfg.Permits, cfg.Seq = permits, cfg.Seq+1
	if err := s.writeConfig(ctx, cfg); err != nil {
		return err
	}
	s.setConfig(cfg)
	s.log.Info("resized", "from", old, "to", permits)
	return nil
}

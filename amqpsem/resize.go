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
	var old int
	changed, err := s.updateConfig(ctx, func(cfg *config) (bool, error) {
		old = cfg.Permits
		cfg.Permits = permits
		return old != permits, nil
	})
	if changed {
		s.log.Info("resized", "from", old, "to", permits)
	}
	return err
}

// updateConfig reads the configuration under the creation lock, lets edit
// change it, and writes it back (its Seq one up) if edit says it changed
// (an error from edit ends it, writing nothing):
// Resize's count and the controller record. The lock keeps every other
// writer (a repair, a delete) out meanwhile, so no change is lost.
func (s *Semaphore) updateConfig(ctx context.Context, edit func(*config) (bool, error)) (changed bool, err error) {
	if s.isClosed() {
		return false, tokensem.ErrClosed
	}
	ctx, unlock, err := s.lock(ctx)
	if err != nil {
		return false, err
	}
	defer unlock()
	cfg, err := s.readConfig(ctx)
	if err != nil {
		return false, err
	}
	if ok, err := edit(&cfg); !ok || err != nil {
		return false, err
	}
	cfg.Seq++
	if err := s.writeConfig(ctx, cfg); err != nil {
		return false, err
	}
	s.setConfig(cfg)
	return true, nil
}

package natssem

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/reconciler"
)

// Resize changes the number of permits and repairs the token set to match
// (see reconciler.Run): growing issues tokens for the new slots; shrinking
// removes the ready tokens of slots >= permits, while their holders keep
// their permits until they release (their tokens are then retired by the
// next acquirer). Every client admits by the new count within 2 s,
// so admission never exceeds max(old, new) and converges to the new count.
// Of a key of a group, clients learn of the change from the group's
// generation, which Resize moves on after the count (generation.go); if
// that write fails, Resize returns the error, running it again moves the
// generation, and until then clients admit by the new count within a
// minute.
//
// Errors: tokensem.ErrInvalidPermits, tokensem.ErrClosed, or a wrapped
// broker error.
func (s *Semaphore) Resize(ctx context.Context, permits int) (reconciler.Report, error) {
	return reconciler.Resize(ctx, s.Inventory(), permits, s.writePermits)
}

// writePermits stores the new permit count under the admin lock, so that
// no reconcile run sees it change halfway through.
func (s *Semaphore) writePermits(ctx context.Context, permits int) error {
	if s.isClosed() {
		return tokensem.ErrClosed
	}
	unlock, err := s.lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	for {
		cfg, rev, err := s.readConfig(ctx)
		if err != nil {
			return err
		}
		if cfg.State == stateDeleting {
			return fmt.Errorf("%w: %s is being deleted", tokensem.ErrNotInitialized, s.name)
		}
		if cfg.Permits == permits {
			// Bumped again: a resize whose bump failed is retried so.
			return s.bumpGeneration(ctx)
		}
		old := cfg.Permits
		cfg.Permits = permits
		rctx, cancel := s.rtt(ctx)
		_, err = s.kv.Update(rctx, s.lay.key(configKey), cfg.encode(), rev)
		cancel()
		switch {
		case errors.Is(err, jetstream.ErrKeyRevisionMismatch), errors.Is(err, jetstream.ErrKeyExists):
			continue // changed meanwhile (a client of an earlier version): read again
		case err != nil:
			return wrapBrokerErr(err)
		}
		s.setConfig(cfg)
		s.log.Info("resized", "from", old, "to", permits)
		// Of a key of a group: after the write, so that a client that reads
		// the new generation reads the new count (generation.go).
		return s.bumpGeneration(ctx)
	}
}

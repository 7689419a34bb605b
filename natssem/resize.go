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
// minute. Clients need publish permission on the generation's subject
// ($KV.<bucket>._generation, the bucket of ResourcesOf) as on the bucket's other records.
//
// Errors: tokensem.ErrInvalidPermits, tokensem.ErrClosed, or a wrapped
// broker error.
func (s *Semaphore) Resize(ctx context.Context, permits int) (reconciler.Report, error) {
	r, err := reconciler.Resize(ctx, s.Inventory(), permits, s.writePermits)
	if errors.Is(err, tokensem.ErrInvalidPermits) || errors.Is(err, tokensem.ErrClosed) {
		return r, err
	}
	// Of a key of a group, clients learn of the count from the group's
	// generation, bumped after it (generation.go): here, whether the
	// reconcile went well or not, since the count may be written either way.
	if aerr := s.announceConfig(ctx); aerr != nil && err == nil {
		err = aerr
	}
	return r, err
}

// writePermits stores the new permit count under the admin lock, so that
// no reconcile run sees it change halfway through.
func (s *Semaphore) writePermits(ctx context.Context, permits int) error {
	if s.isClosed() {
		return tokensem.ErrClosed
	}
	h, err := s.takeLock(ctx)
	if err != nil {
		return err
	}
	defer h.unlock()
	for {
		cfg, rev, err := h.readConfig(ctx)
		if err != nil {
			return err
		}
		if cfg.State == stateDeleting {
			return fmt.Errorf("%w: %s is being deleted", tokensem.ErrNotInitialized, s.name)
		}
		if cfg.Permits == permits {
			return nil
		}
		old := cfg.Permits
		cfg.Permits = permits
		_, err = s.updateConfig(ctx, cfg, rev)
		switch {
		case errors.Is(err, jetstream.ErrKeyRevisionMismatch), errors.Is(err, jetstream.ErrKeyExists):
			continue // changed meanwhile (a client of an earlier version): read again
		case err != nil:
			return err
		}
		s.setConfig(cfg)
		s.log.Info("resized", "from", old, "to", permits)
		return nil
	}
}

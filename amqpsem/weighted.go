package amqpsem

import (
	"context"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/driver"
	"github.com/tokensem/tokensem/internal/weighted"
)

var (
	_ tokensem.Weighted = (*Semaphore)(nil)
	_ driver.Gated      = (*Inventory)(nil)
)

// AcquireN blocks until it holds k permits, all or nothing, or ctx ends;
// see tokensem.Weighted for how weighted callers take turns without
// deadlock or starvation. Callers of k > 1 queue for the semaphore's gate,
// a one-permit semaphore beside it (queue tokensem._gate_NAME), which the
// first such call creates with the same key and queue type (so it needs the
// rights Init needs).
//
// If ctx ends, AcquireN returns ctx.Err() itself once it has handed back
// what it had gathered and the gate (see tokensem.Weighted).
//
// Errors: those of Acquire, tokensem.ErrInvalidPermits (k < 1) and
// tokensem.ErrWeightExceedsPermits (k above the permits).
func (s *Semaphore) AcquireN(ctx context.Context, k int) (*tokensem.PermitSet, error) {
	return s.gatherer().Acquire(ctx, k)
}

// TryAcquireN takes k free permits now, or none: it returns
// tokensem.ErrNoPermit at once when fewer are free or another caller is
// gathering permits. Other errors are those of AcquireN.
func (s *Semaphore) TryAcquireN(ctx context.Context, k int) (*tokensem.PermitSet, error) {
	return s.gatherer().TryAcquire(ctx, k)
}

// gatherer is the semaphore as the weighted gatherer sees it.
func (s *Semaphore) gatherer() weighted.Host[*Semaphore] {
	return weighted.Host[*Semaphore]{
		Sem:   s,
		Gates: &s.gates,
		Done:  s.life.Done(),
		Permits: func(ctx context.Context) (int, error) {
			cfg, err := s.freshConfig(ctx)
			return cfg.Permits, err
		},
		Exists: func(ctx context.Context) error {
			_, err := s.refreshConfig(ctx)
			return err
		},
		MakeGate: func(ctx context.Context) (*Semaphore, error) {
			return newSemaphoreWith(s.c, driver.GateName(s.name), s.gateOptions()).init(ctx, 1)
		},
		OpenGate: func(ctx context.Context) (*Semaphore, error) {
			return newSemaphoreWith(s.c, driver.GateName(s.name), s.gateOptions()).open(ctx)
		},
		Inventory: func(g *Semaphore) driver.Inventory { return g.Inventory() },
	}
}

// gateOptions are the options of the gate: the semaphore's, with its queue
// type, and no observer (the gate's permits are not the semaphore's).
func (s *Semaphore) gateOptions() options {
	o := s.opts
	o.Observer = nil
	if qt := s.config().QueueType; qt != "" {
		o.queueType = qt
	}
	return o
}

// Gate returns the inventory of the semaphore's gate (see AcquireN), or nil
// if no weighted caller ever made one: reconciler.Run repairs it after the
// semaphore.
func (inv *Inventory) Gate(ctx context.Context) (driver.Inventory, error) {
	return inv.s.gatherer().GateInventory(ctx)
}

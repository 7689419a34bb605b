package natssem

import (
	"context"
	"errors"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/weighted"
	"github.com/tokensem/tokensem/reconciler"
)

var _ reconciler.Gated = (*Inventory)(nil)

var _ tokensem.Weighted = (*Semaphore)(nil)

// AcquireN blocks until it holds k permits, all or nothing, or ctx ends;
// see tokensem.Weighted for how weighted callers take turns without
// deadlock or starvation. Callers of k > 1 queue for the semaphore's gate,
// a one-permit semaphore beside it (stream TOKENSEM__gate_NAME), which the
// first such call creates with the same lease, key and replicas.
//
// Errors: those of Acquire, tokensem.ErrInvalidPermits (k < 1) and
// tokensem.ErrWeightExceedsPermits (k above the permits).
func (s *Semaphore) AcquireN(ctx context.Context, k int) (*tokensem.PermitSet, error) {
	return weighted.Acquire(ctx, s.weightedSource(), k)
}

// TryAcquireN takes k free permits now, or none: it returns
// tokensem.ErrNoPermit at once when fewer are free or another caller is
// gathering permits. Other errors are those of AcquireN.
func (s *Semaphore) TryAcquireN(ctx context.Context, k int) (*tokensem.PermitSet, error) {
	return weighted.TryAcquire(ctx, s.weightedSource(), k)
}

func (s *Semaphore) weightedSource() weighted.Source {
	return weighted.Source{
		Sem:  s,
		Gate: s.gate,
		Permits: func(ctx context.Context) (int, error) {
			cfg, err := s.freshConfig(ctx)
			return cfg.Permits, err
		},
	}
}

// gate returns the gate of the semaphore, creating it (Init) on first use.
func (s *Semaphore) gate(ctx context.Context) (tokensem.Semaphore, error) {
	g, err := s.gateSemaphore(ctx, true)
	if err != nil {
		return nil, err
	}
	return g, nil
}

// gateSemaphore returns the gate, creating it if create is set; nil, nil
// when it does not exist and create is not set.
func (s *Semaphore) gateSemaphore(ctx context.Context, create bool) (*Semaphore, error) {
	s.gateMu.Lock()
	defer s.gateMu.Unlock()
	if s.gateSem != nil {
		return s.gateSem, nil
	}
	if s.isClosed() {
		return nil, tokensem.ErrClosed
	}
	o := s.opts
	o.Lease, o.leaseSet = s.Lease(), false // a gate left from an earlier life of the name keeps its lease
	o.Observer = nil                       // the gate's permits are not the semaphore's
	if s.stream != nil {
		o.replicas = s.stream.CachedInfo().Config.Replicas
	}
	var (
		g   *Semaphore
		err error
	)
	if create {
		g, err = initSemaphore(ctx, s.nc, weighted.GateName(s.name), 1, o)
	} else {
		g, err = openSemaphore(ctx, s.nc, weighted.GateName(s.name), o)
		if errors.Is(err, tokensem.ErrNotInitialized) {
			return nil, nil
		}
	}
	if err != nil {
		return nil, err
	}
	if s.isClosed() {
		_ = g.Close()
		return nil, tokensem.ErrClosed
	}
	s.gateSem = g
	return g, nil
}

// closeGate closes the gate, if one was opened.
func (s *Semaphore) closeGate() {
	s.gateMu.Lock()
	defer s.gateMu.Unlock()
	if s.gateSem != nil {
		_ = s.gateSem.Close()
	}
}

// Gate returns the inventory of the semaphore's gate (see AcquireN), or nil
// if no weighted caller ever made one: reconciler.Run repairs it after the
// semaphore.
func (inv *Inventory) Gate(ctx context.Context) (reconciler.Inventory, error) {
	g, err := inv.s.gateSemaphore(ctx, false)
	if err != nil || g == nil {
		return nil, err
	}
	return g.Inventory(), nil
}

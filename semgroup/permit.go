package semgroup

import (
	"context"
	"sync"

	"github.com/tokensem/tokensem"
)

var _ tokensem.Permit = (*Permit)(nil)

// Permit is a permit obtained through a Group. It is the backend's permit
// (Token, Fence, Done and Err are its own) whose Release also tells the
// Group that the permit no longer keeps its semaphore open.
type Permit struct {
	tokensem.Permit
	g    *Group
	e    *entry
	once sync.Once
}

// Key returns the key the permit was acquired for.
func (p *Permit) Key() string { return p.e.key }

// Unwrap returns the backend's permit (a *natssem.Permit, for example).
// Release it through p, not directly, or its semaphore stays open until
// the Group closes.
func (p *Permit) Unwrap() tokensem.Permit { return p.Permit }

// Release releases the backend's permit and drops the Group's reference
// to its semaphore (an evicted semaphore is closed with its last
// reference). It returns what the backend's Release returns:
// tokensem.ErrReleased on a second call, an error wrapping
// tokensem.ErrLeaseLost after a loss.
func (p *Permit) Release(ctx context.Context) error {
	err := p.Permit.Release(ctx)
	p.once.Do(func() { p.g.unref(p.e) })
	return err
}

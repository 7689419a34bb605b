package semgroup

import (
	"context"

	"github.com/tokensem/tokensem"
)

// For returns key's semaphore as a tokensem.Semaphore, for code written
// against the interface (tokensem.Do, httpsem). It is a view: each call
// goes through the Group (opening the semaphore if needed), and its Close
// does nothing, since the Group owns the semaphore. A bad key shows up as
// an error wrapping tokensem.ErrInvalidName on the first call.
func (g *Group) For(key string) tokensem.Semaphore { return view{g, key} }

type view struct {
	g   *Group
	key string
}

var _ tokensem.Semaphore = view{}

func (v view) Acquire(ctx context.Context) (tokensem.Permit, error) {
	p, err := v.g.Acquire(ctx, v.key)
	if err != nil {
		return nil, err
	}
	return p, nil
}

func (v view) TryAcquire(ctx context.Context) (tokensem.Permit, error) {
	p, err := v.g.TryAcquire(ctx, v.key)
	if err != nil {
		return nil, err
	}
	return p, nil
}

func (v view) Status(ctx context.Context) (tokensem.Status, error) { return v.g.Status(ctx, v.key) }

// Close does nothing: the Group owns the semaphore.
func (v view) Close() error { return nil }

package semgroup

import (
	"context"
	"errors"
	"time"

	"github.com/tokensem/tokensem"
)

// The idle expiry (WithIdleExpiry): a goroutine owned by the Group checks
// the keys every expiryEvery, deletes the semaphores this Group has not
// used for the expiry, one at a time, and stops with Close.

// expiryEvery is how often the keys are checked for an expiry of d.
func expiryEvery(d time.Duration) time.Duration {
	return min(max(d/4, 10*time.Millisecond), time.Minute)
}

func (g *Group) expireIdle() {
	defer g.janitor.Done()
	t := time.NewTicker(expiryEvery(g.opts.idleExpiry))
	defer t.Stop()
	for {
		select {
		case <-g.ctx.Done():
			return
		case <-t.C:
		}
		for _, x := range g.takeIdle(time.Now()) {
			g.expire(x)
		}
	}
}

// idleKey is a key whose semaphore the expiry deletes; sem is the Group's
// handle to close first, if the key was still cached.
type idleKey struct {
	key, name string
	sem       tokensem.Semaphore
	done      chan struct{} // closed when the delete is over
}

// takeIdle removes the keys idle since before now minus the expiry from
// the cache and marks them expiring: a use of one of them waits until its
// delete is over.
func (g *Group) takeIdle(now time.Time) []idleKey {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil
	}
	var out []idleKey
	mark := func(key, name string, sem tokensem.Semaphore) {
		done := make(chan struct{})
		g.expiring[key] = done
		out = append(out, idleKey{key: key, name: name, sem: sem, done: done})
	}
	for key, e := range g.entries {
		if e.refs > 0 || e.sem == nil || e.closed || now.Sub(e.lastUsed) < g.opts.idleExpiry {
			continue
		}
		delete(g.entries, key)
		g.lru.Remove(e.elem)
		e.elem, e.closed = nil, true
		mark(key, e.name, e.sem)
	}
	for key, since := range g.idleSince {
		if now.Sub(since) < g.opts.idleExpiry {
			continue
		}
		delete(g.idleSince, key)
		name, err := g.Name(key)
		if err != nil {
			continue // cannot happen: the key was opened
		}
		mark(key, name, nil)
	}
	return out
}

// expire closes x's semaphore and deletes it from the broker, unless a
// permit of it is held somewhere.
func (g *Group) expire(x idleKey) {
	defer func() {
		g.mu.Lock()
		delete(g.expiring, x.key)
		g.mu.Unlock()
		close(x.done)
	}()
	if x.sem != nil {
		g.closeSem(&entry{name: x.name, sem: x.sem})
	}
	ctx, cancel := context.WithTimeout(g.ctx, g.opts.openTimeout)
	defer cancel()
	err := g.opts.deleteFn(ctx, x.name)
	switch {
	case err == nil:
		g.opts.log.Debug("deleted an idle semaphore", "key", x.key, "semaphore", x.name, "idle_for", g.opts.idleExpiry)
	case errors.Is(err, tokensem.ErrHeld):
		g.opts.log.Debug("idle here, but held elsewhere: not deleted", "key", x.key, "semaphore", x.name)
	case errors.Is(err, tokensem.ErrNotInitialized):
	case g.ctx.Err() != nil:
	default:
		g.opts.log.Warn("deleting an idle semaphore failed; trying again after another idle period", "key", x.key, "semaphore", x.name, "err", err)
		g.mu.Lock()
		if g.entries[x.key] == nil {
			g.idleSince[x.key] = time.Now()
		}
		g.mu.Unlock()
	}
}

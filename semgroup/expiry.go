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
		// One key at a time, each taken out of the cache only as its
		// delete starts: a use of another idle key meanwhile keeps it.
		for _, key := range g.idleKeys(time.Now()) {
			if x, ok := g.takeIdle(key, time.Now()); ok {
				g.expire(x)
			}
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

// idleKeys returns the keys idle since before now minus the expiry.
func (g *Group) idleKeys(now time.Time) []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []string
	for key, e := range g.entries {
		if g.idleLocked(e, now) {
			out = append(out, key)
		}
	}
	for key, since := range g.idleSince {
		if now.Sub(since) >= g.opts.idleExpiry {
			out = append(out, key)
		}
	}
	return out
}

func (g *Group) idleLocked(e *entry, now time.Time) bool {
	return e.refs == 0 && e.sem != nil && !e.closed && now.Sub(e.lastUsed) >= g.opts.idleExpiry
}

// takeIdle removes key from the cache if it is still idle at now and marks
// it expiring: a use of it waits until its delete is over.
func (g *Group) takeIdle(key string, now time.Time) (idleKey, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed || g.expiring[key] != nil {
		return idleKey{}, false
	}
	x := idleKey{key: key, done: make(chan struct{})}
	if e := g.entries[key]; e != nil {
		if !g.idleLocked(e, now) {
			return idleKey{}, false
		}
		delete(g.entries, key)
		g.lru.Remove(e.elem)
		e.elem, e.closed = nil, true
		x.name, x.sem = e.name, e.sem
	} else {
		since, ok := g.idleSince[key]
		if !ok || now.Sub(since) < g.opts.idleExpiry {
			return idleKey{}, false
		}
		delete(g.idleSince, key)
		name, err := g.Name(key)
		if err != nil {
			return idleKey{}, false // cannot happen: the key was opened
		}
		x.name = name
	}
	g.expiring[key] = x.done
	return x, true
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

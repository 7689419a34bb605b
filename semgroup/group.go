package semgroup

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tokensem/tokensem"
)

// InitFunc creates the semaphore name with permits permits, or opens it if
// it exists with that many (natssem.Init and amqpsem.Init in a closure). It
// must return tokensem.ErrPermitMismatch when the semaphore exists with
// another number of permits. An InitFunc built on Open may ignore permits.
type InitFunc func(ctx context.Context, name string, permits int) (tokensem.Semaphore, error)

// Group is a bounded cache of semaphores by key. It is safe for concurrent
// use. Create one with New and Close it when done.
type Group struct {
	init    InitFunc
	permits int
	opts    options

	ctx     context.Context // the opens' parent; cancelled by Close
	cancel  context.CancelFunc
	opening sync.WaitGroup // open goroutines
	janitor sync.WaitGroup // the idle expiry's goroutine (expiry.go)

	mu       sync.Mutex
	entries  map[string]*entry
	lru      *list.List          // of *entry, most recently used first
	detached map[*entry]struct{} // evicted while in use, open until unused
	closed   bool
	// With an idle expiry: keys evicted unused, by when they were last
	// used, and keys whose semaphore is being deleted (a use waits for the
	// channel to close).
	idleSince map[string]time.Time
	expiring  map[string]chan struct{}
}

// entry is one key's semaphore, opened once.
type entry struct {
	key, name string
	ready     chan struct{}      // closed once the open finished
	sem       tokensem.Semaphore // set before ready closes; nil on failure
	err       error              // the open's error, set before ready closes

	// Guarded by Group.mu.
	refs     int           // waiting or running calls and unreleased permits
	elem     *list.Element // nil once evicted
	closed   bool          // sem was (or is being) closed
	lastUsed time.Time     // when refs last dropped to 0 (or the first use began)
}

// New returns a Group that creates each key's semaphore with init and
// permits permits (unless WithPermitsFunc says otherwise).
//
// Errors: tokensem.ErrInvalidOption (a nil init or a bad option),
// tokensem.ErrInvalidPermits.
func New(init InitFunc, permits int, opts ...Option) (*Group, error) {
	if init == nil {
		return nil, fmt.Errorf("%w: nil InitFunc", tokensem.ErrInvalidOption)
	}
	if err := tokensem.ValidatePermits(permits); err != nil {
		return nil, err
	}
	o, err := newOptions(opts)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	g := &Group{
		init: init, permits: permits, opts: o, ctx: ctx, cancel: cancel,
		entries: make(map[string]*entry), lru: list.New(), detached: make(map[*entry]struct{}),
		idleSince: make(map[string]time.Time), expiring: make(map[string]chan struct{}),
	}
	if o.idleExpiry > 0 {
		g.janitor.Add(1)
		go g.expireIdle()
	}
	return g, nil
}

// ErrKeyNotAllowed is returned for a key the group's key filter refuses
// (WithKeyFilter).
var ErrKeyNotAllowed = errors.New("semgroup: key not allowed")

// Name returns the semaphore name of key, or an error wrapping
// tokensem.ErrInvalidName, or ErrKeyNotAllowed for a key the group's key
// filter refuses. The empty key is never valid, even with a prefix.
func (g *Group) Name(key string) (string, error) {
	if key == "" {
		return "", fmt.Errorf("semgroup: %w: empty key", tokensem.ErrInvalidName)
	}
	name := g.opts.prefix + key
	if err := tokensem.ValidateName(name); err != nil {
		return "", fmt.Errorf("semgroup: key %q: %w", clipKey(key), err)
	}
	if g.opts.allowKey != nil && !g.opts.allowKey(key) {
		return "", fmt.Errorf("%w: %q", ErrKeyNotAllowed, key)
	}
	return name, nil
}

// clipKey cuts a key that is not a valid name (it may be anything a
// request sent) to what an error quotes.
func clipKey(key string) string {
	if len(key) > tokensem.MaxNameLen {
		return key[:tokensem.MaxNameLen] + "…"
	}
	return key
}

// Acquire blocks until a permit of key's semaphore is held or ctx ends,
// opening the semaphore first if it is not cached. The permit must be
// released, even after a loss (see the package doc).
//
// Errors: tokensem.ErrInvalidName (a bad key), ErrKeyNotAllowed, ctx.Err(),
// tokensem.ErrClosed, the InitFunc's error unchanged (for example
// tokensem.ErrPermitMismatch), or the semaphore's Acquire error.
func (g *Group) Acquire(ctx context.Context, key string) (*Permit, error) {
	return g.acquire(ctx, key, tokensem.Semaphore.Acquire)
}

// TryAcquire takes a permit of key's semaphore if one is free now and
// returns tokensem.ErrNoPermit otherwise. Opening the semaphore (on first
// use) may wait, bounded by ctx.
//
// Errors: as Acquire, plus tokensem.ErrNoPermit.
func (g *Group) TryAcquire(ctx context.Context, key string) (*Permit, error) {
	return g.acquire(ctx, key, tokensem.Semaphore.TryAcquire)
}

func (g *Group) acquire(ctx context.Context, key string,
	take func(tokensem.Semaphore, context.Context) (tokensem.Permit, error)) (*Permit, error) {
	var p tokensem.Permit
	e, err := g.withSem(ctx, key, func(e *entry) (err error) {
		p, err = take(e.sem, ctx)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &Permit{Permit: p, g: g, e: e}, nil
}

// reopens is how many times a call opens its key again after finding its
// semaphore deleted.
const reopens = 2

// withSem runs fn on key's semaphore and returns its entry, still
// referenced, if fn succeeds. A semaphore deleted behind the Group's back
// (by another replica's idle expiry, or an operator) answers
// tokensem.ErrNotInitialized: the key is then opened afresh, which creates
// it again, and fn retried.
func (g *Group) withSem(ctx context.Context, key string, fn func(*entry) error) (*entry, error) {
	for attempt := 0; ; attempt++ {
		e, err := g.use(ctx, key)
		if err != nil {
			return nil, err
		}
		err = fn(e)
		if err == nil {
			return e, nil
		}
		if errors.Is(err, tokensem.ErrNotInitialized) && attempt < reopens {
			g.opts.log.Debug("semaphore deleted elsewhere; opening it again", "key", key, "semaphore", e.name)
			g.forget(e)
			g.unref(e)
			continue
		}
		g.unref(e)
		return nil, err
	}
}

// forget drops e from the cache, if it is still there; it is closed once
// unused.
func (g *Group) forget(e *entry) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.entries[e.key] == e {
		delete(g.entries, e.key)
		g.lru.Remove(e.elem)
		e.elem = nil
		g.detached[e] = struct{}{}
	}
}

// Do runs fn under a permit of key's semaphore: tokensem.Do on For(key),
// with the same options and errors.
func (g *Group) Do(ctx context.Context, key string, fn func(ctx context.Context) error, opts ...tokensem.DoOption) error {
	return tokensem.Do(ctx, g.For(key), fn, opts...)
}

// Open opens key's semaphore if it is not cached — creating it with its
// permits through the InitFunc — without taking a permit. Acquire does the
// same on first use; Open lets a caller pay for the open outside a wait
// budget (httpsem.ByKey does), or fail early on a bad key or a mismatch.
//
// Errors: as Acquire, without the semaphore's Acquire error.
func (g *Group) Open(ctx context.Context, key string) error {
	e, err := g.use(ctx, key)
	if err != nil {
		return err
	}
	g.unref(e)
	return nil
}

// Status takes a census of key's semaphore, opening it if needed.
//
// Errors: as Acquire, or the semaphore's Status error.
func (g *Group) Status(ctx context.Context, key string) (tokensem.Status, error) {
	var st tokensem.Status
	e, err := g.withSem(ctx, key, func(e *entry) (err error) {
		st, err = e.sem.Status(ctx)
		return err
	})
	if err != nil {
		return tokensem.Status{}, err
	}
	g.unref(e)
	return st, nil
}

// Len returns the number of keys cached now (at most the WithMaxSize bound).
func (g *Group) Len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.entries)
}

// Close closes every semaphore the group opened, including evicted ones
// still in use, and makes later calls return tokensem.ErrClosed. Callers
// waiting in Acquire return tokensem.ErrClosed; permits already held stay
// valid and can still be released. An open in progress is cancelled and
// awaited. Close is idempotent; it returns the semaphores' Close errors.
func (g *Group) Close() error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	g.closed = true
	g.mu.Unlock()
	g.cancel()
	g.opening.Wait()
	g.janitor.Wait()

	g.mu.Lock()
	var toClose []*entry
	collect := func(e *entry) {
		if e.sem != nil && !e.closed {
			e.closed = true
			toClose = append(toClose, e)
		}
	}
	for _, e := range g.entries {
		collect(e)
	}
	for e := range g.detached {
		collect(e)
	}
	clear(g.entries)
	clear(g.detached)
	g.lru.Init()
	g.mu.Unlock()

	var errs []error
	for _, e := range toClose {
		if err := e.sem.Close(); err != nil {
			errs = append(errs, fmt.Errorf("semgroup: close %s: %w", e.name, err))
		}
	}
	return errors.Join(errs...)
}

// use returns key's entry, opened, with a reference the caller must drop
// with unref.
func (g *Group) use(ctx context.Context, key string) (*entry, error) {
	name, err := g.Name(key)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	g.mu.Lock()
	for {
		if g.closed {
			g.mu.Unlock()
			return nil, tokensem.ErrClosed
		}
		deleting := g.expiring[key]
		if deleting == nil {
			break
		}
		// The idle expiry is deleting this key's semaphore: open it again
		// (creating it) only once that is over.
		g.mu.Unlock()
		select {
		case <-deleting:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		g.mu.Lock()
	}
	delete(g.idleSince, key)
	e := g.entries[key]
	var evicted []*entry
	if e == nil {
		e = &entry{key: key, name: name, ready: make(chan struct{})}
		g.entries[key] = e
		e.elem = g.lru.PushFront(e)
		evicted = g.evictLocked()
		g.opening.Add(1)
		go g.open(e)
	} else {
		g.lru.MoveToFront(e.elem)
	}
	e.refs++
	e.lastUsed = time.Now()
	g.mu.Unlock()
	g.closeAll(evicted)

	select {
	case <-e.ready:
	case <-ctx.Done():
		g.unref(e)
		return nil, ctx.Err()
	}
	if e.err != nil {
		g.unref(e)
		return nil, e.err
	}
	return e, nil
}

// open runs the InitFunc for e, once, and publishes the outcome.
func (g *Group) open(e *entry) {
	defer g.opening.Done()
	sem, err := g.create(e)

	g.mu.Lock()
	switch {
	case err == nil && g.closed:
		// Close is waiting for us and will not see this semaphore.
		e.err = tokensem.ErrClosed
		g.mu.Unlock()
		_ = sem.Close()
		close(e.ready)
		return
	case err != nil:
		e.err = err
		if g.entries[e.key] == e {
			delete(g.entries, e.key)
			g.lru.Remove(e.elem)
			e.elem = nil
		}
		delete(g.detached, e)
		g.opts.log.Debug("open failed", "key", e.key, "semaphore", e.name, "err", err)
	default:
		e.sem = sem
		g.opts.log.Debug("opened", "key", e.key, "semaphore", e.name)
	}
	closeNow := g.unusedLocked(e)
	close(e.ready)
	g.mu.Unlock()
	if closeNow {
		g.closeSem(e)
	}
}

// create works out the permits of e's key and calls the InitFunc.
func (g *Group) create(e *entry) (tokensem.Semaphore, error) {
	permits := g.permits
	if g.opts.permitsFor != nil {
		if n := g.opts.permitsFor(e.key); n != 0 {
			permits = n
		}
	}
	if err := tokensem.ValidatePermits(permits); err != nil {
		return nil, fmt.Errorf("semgroup: key %q: %w", e.key, err)
	}
	ctx, cancel := context.WithTimeout(g.ctx, g.opts.openTimeout)
	defer cancel()
	sem, err := g.init(ctx, e.name, permits)
	if err == nil && sem == nil {
		err = fmt.Errorf("semgroup: InitFunc returned no semaphore and no error for %s", e.name)
	}
	return sem, err
}

// evictLocked drops least recently used keys beyond the bound and returns
// the ones to close now; evicted keys still in use are closed when their
// last use ends.
func (g *Group) evictLocked() []*entry {
	var now []*entry
	for g.lru.Len() > g.opts.maxSize {
		e := g.lru.Remove(g.lru.Back()).(*entry)
		delete(g.entries, e.key)
		e.elem = nil
		g.opts.log.Debug("evicted", "key", e.key, "semaphore", e.name, "in_use", e.refs)
		if g.unusedLocked(e) {
			now = append(now, e)
		} else {
			g.detached[e] = struct{}{}
		}
	}
	return now
}

// unusedLocked reports whether e is evicted, opened, unused and not yet
// closed, and if so marks it closed: the caller then closes it.
func (g *Group) unusedLocked(e *entry) bool {
	if e.elem != nil || e.refs > 0 || e.sem == nil || e.closed {
		return false
	}
	e.closed = true
	delete(g.detached, e)
	if g.opts.idleExpiry > 0 && g.entries[e.key] == nil && g.expiring[e.key] == nil && !g.closed {
		g.idleSince[e.key] = e.lastUsed // the idle expiry still deletes it
	}
	return true
}

// unref drops one reference to e, closing it if it was the last use of an
// evicted semaphore.
func (g *Group) unref(e *entry) {
	g.mu.Lock()
	e.refs--
	if e.refs == 0 {
		e.lastUsed = time.Now()
	}
	closeNow := g.unusedLocked(e)
	g.mu.Unlock()
	if closeNow {
		g.closeSem(e)
	}
}

func (g *Group) closeAll(es []*entry) {
	for _, e := range es {
		g.closeSem(e)
	}
}

func (g *Group) closeSem(e *entry) {
	if err := e.sem.Close(); err != nil {
		g.opts.log.Warn("closing an evicted semaphore failed", "semaphore", e.name, "err", err)
	}
}

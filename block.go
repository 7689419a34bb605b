package tokensem

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/tokensem/tokensem/internal/ctxclass"
)

// Block is a global semaphore's permits held in a block by this process
// and handed out to its callers without a round trip to the global
// semaphore's broker: the block mode of a hierarchy of limits. Pass a Block
// where the global semaphore would go, AcquireAll(ctx, block, regional) say,
// and a caller that finds a permit free in the block pays only the regional
// acquire; the exact mode (the global semaphore itself) pays both.
//
// Each permit a Block hands out is one permit of the global semaphore that
// this process holds, used by one caller at a time: the block's callers never
// outnumber the global permits it holds, so the global limit holds at every
// instant, across every process. The block keeps one wait under way at the
// global semaphore (in the caller's class) for each caller that found no
// free permit in it, so it grows with its callers' demand, and a permit its
// caller releases goes:
//   - to the block's next waiting caller (higher class first, then arrival
//     order; the wait at the global semaphore it leaves stays under way
//     for the block's next caller of that class, and is cancelled if none
//     comes within WithBlockIdle), else
//   - back to the global semaphore if it has served WithBlockReuse callers
//     since it was acquired, so that callers elsewhere queued at the global
//     semaphore get their turn in the broker's order (the fairness rule
//     between blocks: none keeps a permit for more than that many holds
//     while others wait), else
//   - into the block, free, and back to the global semaphore after
//     WithBlockIdle without a caller.
//
// A wait its caller left may still win a permit before it is cancelled:
// that permit goes to the block's next waiting caller, of any class, or
// into the block, free, as a release's does. So a block may hold a permit
// no caller asked for, for at most about twice WithBlockIdle, and a spare
// wait keeps its class's place in the broker's queue for that long.
//
// A permit of a Block is lost when its global permit is (its Done closes
// with the global permit's error), as one permit of a PermitSet is; when
// the process dies, its global permits come back as any holder's do (within
// a lease on NATS, at once on RabbitMQ). Token, Fence and Deadline are the
// global permit's: callers that reuse one global permit in turn share its
// fence, so a resource that must tell them apart checks the fence of the
// regional permit held beside it.
//
// Close releases the free permits, ends the waits under way and makes
// them and later calls return ErrClosed; permits held stay valid until
// released, and then go back to the global semaphore. It returns once the
// block's waits at the global semaphore have ended (about a round trip
// after their cancellation). Closing the Block does not close the global
// semaphore.
type Block struct {
	global  Semaphore
	idle    time.Duration
	reuse   int
	life    context.Context // of the global waits; ends at Close
	stop    context.CancelFunc
	running sync.WaitGroup // the global waits' goroutines

	mu      sync.Mutex
	closed  bool
	free    []*blockSlot   // global permits no caller holds, oldest first
	waiters []*blockWaiter // callers waiting for a permit, by class, then arrival
	seq     uint64         // arrival order of waiters
	waits   []*globalWait  // under way at the global semaphore, oldest first
}

// Defaults of a Block's options.
const (
	DefaultBlockIdle  = 50 * time.Millisecond
	DefaultBlockReuse = 32
)

// BlockOption configures a Block.
type BlockOption func(*Block) error

// WithBlockIdle is how long a free permit stays in the block before it
// goes back to the global semaphore, and how long a wait at the global
// semaphore that its caller left stays under way for the block's next
// caller of its class. 0 returns a permit as soon as no caller of the
// block waits for it, and cancels a left wait at once. Default
// DefaultBlockIdle.
func WithBlockIdle(d time.Duration) BlockOption {
	return func(b *Block) error {
		if d < 0 {
			return fmt.Errorf("%w: block idle %v below 0", ErrInvalidOption, d)
		}
		b.idle = d
		return nil
	}
}

// WithBlockReuse is how many callers one global permit serves before it
// goes back to the global semaphore (and is acquired again, at the back of
// its queue, if callers still wait). 1 makes every caller's permit its own
// global acquire. Default DefaultBlockReuse.
func WithBlockReuse(n int) BlockOption {
	return func(b *Block) error {
		if n < 1 {
			return fmt.Errorf("%w: block reuse %d below 1", ErrInvalidOption, n)
		}
		b.reuse = n
		return nil
	}
}

// NewBlock returns a Block of global's permits. global must have a Name
// method (natssem's and amqpsem's do), which the Block shares, so that
// AcquireAll orders it as it orders global.
func NewBlock(global Semaphore, opts ...BlockOption) (*Block, error) {
	if _, ok := global.(named); !ok || global == nil {
		return nil, fmt.Errorf("%w: a block of %T: the semaphore has no Name method", ErrInvalidOption, global)
	}
	b := &Block{global: global, idle: DefaultBlockIdle, reuse: DefaultBlockReuse}
	for _, o := range opts {
		if err := o(b); err != nil {
			return nil, err
		}
	}
	b.life, b.stop = context.WithCancel(context.Background())
	return b, nil
}

// Name returns the global semaphore's name.
func (b *Block) Name() string { return b.global.(named).Name() }

// blockSlot is one global permit the block holds.
type blockSlot struct {
	p      Permit
	uses   int           // callers it has been handed to
	holder *blockPermit  // nil while free
	idle   *time.Timer   // while free, with an idle bound
	gone   chan struct{} // closed when the block gives p up
}

// reserved is the holder of a slot a release handed to a waiter, until
// the waiter binds it (or gives it on).
var reserved = &blockPermit{}

// loss is the error of a caller whose slot's global permit was lost, or
// nil while it is held.
func (s *blockSlot) loss() error {
	if err := s.p.Err(); err != nil {
		return fmt.Errorf("%w: the block's global permit: %w", ErrLeaseLost, err)
	}
	return nil
}

// giveUp takes the slot out of the block and releases its global permit.
func (s *blockSlot) giveUp(ctx context.Context) error {
	close(s.gone)
	return s.p.Release(ctx)
}

// blockWaiter is a caller waiting for a permit of the block.
type blockWaiter struct {
	class Priority
	seq   uint64
	ready chan struct{} // closed when slot or err is set
	slot  *blockSlot    // handed to it by a release or a global wait
	err   error         // the global semaphore's, or ErrClosed
}

// globalWait is one wait of the block at the global semaphore, in a class.
// The block keeps as many waits of a class under way as it has callers of
// that class waiting; they are the block's, not a caller's, so that a
// caller served by a release in the block leaves its wait to the next
// caller instead of cancelling it. (A cancelled wait costs a round trip and
// loses its place in the broker's queue; on RabbitMQ it closes a channel
// and bounces a token already on its way.) A wait no caller needs is spare:
// a caller that comes within the block's idle bound takes it over, else it
// is cancelled.
type globalWait struct {
	class  Priority
	cancel context.CancelFunc
	spare  bool          // no caller needs it
	timer  *time.Timer   // while spare: cancels it past the idle bound
	ended  bool          // cancelled: it cannot be taken over
	done   chan struct{} // closed when its goroutine has ended
}

// oldestSpare returns the oldest spare wait of a class at most class not
// yet cancelled, or nil: a refused wait never ends the spare a caller of a
// higher class would take over. Call with b.mu held.
func (b *Block) oldestSpare(class Priority) *globalWait {
	for _, g := range b.waits {
		if g.spare && !g.ended && g.class <= class {
			return g
		}
	}
	return nil
}

// Acquire returns a free permit of the block, or waits for one: at the
// global semaphore (which may grow the block) and for a release of the
// block's callers, whichever comes first. If ctx ends first it returns
// ctx.Err() itself and holds nothing.
func (b *Block) Acquire(ctx context.Context) (Permit, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	class, err := classOf(ctx)
	if err != nil {
		return nil, err
	}
	for {
		p, err, again := b.wait(ctx, class)
		if !again {
			return p, err
		}
	}
}

// classOf is ctx's class (WithPriority), or ErrInvalidOption.
func classOf(ctx context.Context) (Priority, error) {
	class := Priority(ctxclass.Of(ctx))
	if class < LowestPriority || class > HighestPriority {
		return 0, fmt.Errorf("%w: priority %d is outside [%d, %d]", ErrInvalidOption, class, LowestPriority, HighestPriority)
	}
	return class, nil
}

// TryAcquire returns a free permit of the block, or a permit the global
// semaphore has free now, or ErrNoPermit.
func (b *Block) TryAcquire(ctx context.Context) (Permit, error) {
	if _, err := classOf(ctx); err != nil {
		return nil, err
	}
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if p, err, ok := b.takeFree(); ok {
			return p, err
		}
		gp, err := b.global.TryAcquire(ctx)
		if err != nil {
			return nil, err
		}
		b.mu.Lock()
		switch {
		case gp.Err() != nil:
			b.mu.Unlock()
			continue // lost before it was taken in: nothing to give back
		case b.closed:
			b.mu.Unlock()
			_ = gp.Release(context.WithoutCancel(ctx))
			return nil, ErrClosed
		}
		p := b.bind(b.adopt(gp))
		b.mu.Unlock()
		return p, nil
	}
}

// takeFree binds a free permit of the block, if it has one (ok), or
// returns ErrClosed (ok) once it is closed.
func (b *Block) takeFree() (_ Permit, _ error, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.takeFreeLocked()
}

// takeFreeLocked is takeFree with b.mu held.
func (b *Block) takeFreeLocked() (_ Permit, _ error, ok bool) {
	if b.closed {
		return nil, ErrClosed, true
	}
	for len(b.free) > 0 {
		slot := b.free[0]
		b.free = b.free[1:]
		if slot.p.Err() != nil {
			continue // lost: its watcher is dropping it
		}
		return b.bind(slot), nil, true
	}
	return nil, nil, false
}

// wait is one attempt of Acquire. again says that what it got was lost
// before the caller could have it (a permit handed over by a release or a
// global wait): the caller waits anew.
func (b *Block) wait(ctx context.Context, class Priority) (_ Permit, _ error, again bool) {
	b.mu.Lock()
	// The free list is looked at under the lock the waiter joins under,
	// so that a release between the two cannot leave its permit free
	// while this caller waits at the global semaphore.
	if p, err, ok := b.takeFreeLocked(); ok {
		b.mu.Unlock()
		return p, err, false
	}
	b.seq++
	w := &blockWaiter{class: class, seq: b.seq, ready: make(chan struct{})}
	i, _ := slices.BinarySearchFunc(b.waiters, w, func(a, w *blockWaiter) int {
		return cmp.Or(cmp.Compare(w.class, a.class), cmp.Compare(a.seq, w.seq)) // higher class first
	})
	b.waiters = slices.Insert(b.waiters, i, w)
	b.balance()
	b.mu.Unlock()

	select {
	case <-w.ready:
	case <-ctx.Done():
	}

	b.mu.Lock()
	if i := slices.Index(b.waiters, w); i >= 0 {
		b.waiters = slices.Delete(b.waiters, i, i+1) // not served: ctx ended
	}
	slot, lost := w.slot, false
	if slot != nil && slot.p.Err() != nil {
		slot, lost = nil, true // lost while handed over: its watcher drops it
	}
	var out Permit
	var retire *blockSlot
	closed := b.closed
	switch {
	case slot != nil && ctx.Err() == nil && !closed:
		out = b.bind(slot)
	case slot != nil:
		// Handed over as ctx ended (or the block closed): it goes on
		// as a release's would.
		retire = b.place(slot)
	}
	b.balance()
	b.mu.Unlock()
	if retire != nil {
		b.retire(retire)
	}
	switch {
	case out != nil:
		return out, nil, false
	case ctx.Err() != nil:
		return nil, ctx.Err(), false
	case closed:
		return nil, ErrClosed, false
	case lost:
		return nil, nil, true
	}
	return nil, w.err, false
}

// serve hands slot or err to the first waiter (by class, then arrival)
// and takes it off the waiters. Call with b.mu held and a waiter waiting.
func (b *Block) serve(slot *blockSlot, err error) {
	w := b.waiters[0]
	b.waiters = b.waiters[1:]
	w.slot, w.err = slot, err
	if slot != nil {
		slot.holder = reserved
	}
	close(w.ready)
}

// refuse tells the newest waiter of class the global semaphore's err,
// and takes it off the waiters, if the class has more waiters than waits
// still under way (a refused wait was the last one started for it);
// otherwise the wait was no caller's (its caller was served meanwhile),
// and nobody is told: balance starts another if one is needed. A waiter
// of another class has a wait of its own and is never told. Call with
// b.mu held, the refused wait off b.waits.
func (b *Block) refuse(class Priority, err error) {
	waiting, waits := 0, 0
	for _, w := range b.waiters {
		if w.class == class {
			waiting++
		}
	}
	for _, g := range b.waits {
		if g.class == class && !g.ended && !g.spare {
			waits++
		}
	}
	if waiting <= waits {
		return
	}
	for i := len(b.waiters) - 1; i >= 0; i-- {
		if w := b.waiters[i]; w.class == class {
			b.waiters = slices.Delete(b.waiters, i, i+1)
			w.err = err
			close(w.ready)
			return
		}
	}
}

// balance keeps one global wait under way per waiting caller of each
// class: it takes over spare waits of the class first (the oldest, which
// stand earliest in the broker's queue), starts the rest, and makes the
// newest waits spare where callers left. Call with b.mu held.
func (b *Block) balance() {
	if b.closed {
		return
	}
	need := make(map[Priority]int)
	for _, w := range b.waiters {
		need[w.class]++
	}
	for _, g := range b.waits { // oldest first
		switch {
		case g.ended:
		case need[g.class] > 0:
			need[g.class]--
			if g.spare {
				g.spare = false
				g.timer.Stop()
				g.timer = nil
			}
		case !g.spare:
			b.spare(g)
		}
	}
	for class, n := range need {
		for range n {
			b.startWait(class)
		}
	}
}

// spare marks g spare: it is cancelled after the block's idle bound unless
// a caller of its class takes it over first. Call with b.mu held.
func (b *Block) spare(g *globalWait) {
	g.spare = true
	if b.idle == 0 {
		b.end(g)
		return
	}
	var t *time.Timer
	t = time.AfterFunc(b.idle, func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if g.timer == t {
			b.end(g)
		}
	})
	g.timer = t
}

// end cancels g for good. Call with b.mu held.
func (b *Block) end(g *globalWait) {
	g.ended = true
	if g.timer != nil {
		g.timer.Stop()
		g.timer = nil
	}
	g.cancel()
}

// startWait starts a global wait of class. Its goroutine is the block's:
// it ends when the global semaphore answers, or at once when the wait is
// cancelled (spare past the idle bound, or Close). Call with b.mu held.
func (b *Block) startWait(class Priority) {
	ctx, cancel := context.WithCancel(WithPriority(b.life, class))
	g := &globalWait{class: class, cancel: cancel, done: make(chan struct{})}
	b.waits = append(b.waits, g)
	b.running.Go(func() {
		defer close(g.done)
		defer cancel()
		var p Permit
		var err error
		for {
			p, err = b.global.Acquire(ctx)
			b.mu.Lock()
			if p != nil || ctx.Err() != nil || !errors.Is(err, ErrTooManyWaiters) || g.spare || b.closed {
				break
			}
			s := b.oldestSpare(class)
			if s == nil {
				break
			}
			// A spare wait holds a place at the global semaphore that no
			// caller needs: it gives it up, and this wait tries again
			// once it has.
			b.end(s)
			b.mu.Unlock()
			select {
			case <-s.done:
			case <-ctx.Done():
			}
		}
		b.waits = slices.DeleteFunc(b.waits, func(o *globalWait) bool { return o == g })
		wasSpare := g.spare
		cancelled := ctx.Err() != nil // before end, which cancels ctx
		b.end(g)
		var retire *blockSlot
		switch {
		case p != nil && p.Err() == nil:
			retire = b.place(b.adopt(p))
		case p != nil:
			// Lost before it was taken in: nothing to give back.
		case cancelled:
			// Cancelled: spare, or the block closed.
		case !wasSpare && !b.closed:
			// The global semaphore refused the wait: the caller it
			// was started for, the newest of its class, is told (and
			// the others by their own waits).
			b.refuse(class, err)
		}
		b.balance()
		b.mu.Unlock()
		if retire != nil {
			b.retire(retire)
		}
	})
}

// adopt makes a global permit part of the block and watches it for loss.
// Call with b.mu held.
func (b *Block) adopt(p Permit) *blockSlot {
	slot := &blockSlot{p: p, gone: make(chan struct{})}
	// Owned by the slot: it ends when the block gives the permit up
	// (retire) or the permit is lost.
	go func() {
		select {
		case <-p.Done():
			b.lost(slot)
		case <-slot.gone:
		}
	}()
	return slot
}

// bind hands slot to a caller. Call with b.mu held.
func (b *Block) bind(slot *blockSlot) *blockPermit {
	if slot.idle != nil {
		slot.idle.Stop()
		slot.idle = nil
	}
	slot.uses++
	p := &blockPermit{b: b, slot: slot, done: make(chan struct{})}
	slot.holder = p
	return p
}

// place puts a slot no caller holds where it goes next (see Block): to a
// waiter, into the free list, or out of the block (returned, for retire).
// Call with b.mu held.
func (b *Block) place(slot *blockSlot) *blockSlot {
	slot.holder = nil
	switch {
	case slot.p.Err() != nil:
		return nil // lost: its watcher drops it
	case len(b.waiters) > 0 && slot.uses < b.reuse && !b.closed:
		b.serve(slot, nil)
		return nil
	case slot.uses >= b.reuse || b.closed || b.idle == 0:
		return slot
	}
	b.free = append(b.free, slot)
	slot.idle = time.AfterFunc(b.idle, func() {
		b.mu.Lock()
		i := slices.Index(b.free, slot)
		if i >= 0 {
			b.free = slices.Delete(b.free, i, i+1)
		}
		b.mu.Unlock()
		if i >= 0 {
			b.retire(slot)
		}
	})
	return nil
}

// retire gives slots' global permits back to the global semaphore.
func (b *Block) retire(slots ...*blockSlot) {
	for _, s := range slots {
		ctx, cancel := context.WithTimeout(context.Background(), ReleaseTimeout)
		_ = s.giveUp(ctx)
		cancel()
	}
}

// lost drops a slot whose global permit was lost, and tells its holder.
func (b *Block) lost(slot *blockSlot) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if i := slices.Index(b.free, slot); i >= 0 {
		b.free = slices.Delete(b.free, i, i+1)
		if slot.idle != nil {
			slot.idle.Stop()
		}
	}
	if h := slot.holder; h != nil && h != reserved {
		h.end(slot.loss())
	}
}

// Status takes a census of the global semaphore.
func (b *Block) Status(ctx context.Context) (Status, error) { return b.global.Status(ctx) }

// Close gives the free permits back to the global semaphore, ends the
// waits under way and makes them and later calls return ErrClosed, and
// returns once the block's waits at the global semaphore have ended (a
// global semaphore's Acquire returns promptly once cancelled). Permits
// held stay valid until released. It does not close the global semaphore,
// and it is idempotent.
func (b *Block) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	for range b.waiters {
		b.serve(nil, ErrClosed)
	}
	for _, g := range b.waits {
		b.end(g) // a permit it still takes is given back (place)
	}
	b.stop()
	free := b.free
	b.free = nil
	for _, s := range free {
		if s.idle != nil {
			s.idle.Stop()
		}
	}
	b.mu.Unlock()
	b.retire(free...)
	b.running.Wait()
	return nil
}

// blockPermit is a caller's permit of a Block.
type blockPermit struct {
	b    *Block
	slot *blockSlot
	done chan struct{}
	err  error // under b.mu
}

func (p *blockPermit) Token() Token          { return p.slot.p.Token() }
func (p *blockPermit) Fence() uint64         { return p.slot.p.Fence() }
func (p *blockPermit) Deadline() time.Time   { return p.slot.p.Deadline() }
func (p *blockPermit) Done() <-chan struct{} { return p.done }

func (p *blockPermit) Err() error {
	p.b.mu.Lock()
	defer p.b.mu.Unlock()
	if p.err == nil {
		if err := p.slot.loss(); err != nil {
			return err // lost; the slot's watcher is about to close Done
		}
	}
	return p.err
}

// end records the permit's end and closes Done. Call with b.mu held.
func (p *blockPermit) end(err error) {
	if p.err == nil {
		p.err = err
		close(p.done)
	}
}

// Release hands the permit on (see Block): to a caller of the block, into
// the block, or back to the global semaphore.
func (p *blockPermit) Release(ctx context.Context) error {
	b := p.b
	b.mu.Lock()
	if p.err != nil {
		err := p.err
		b.mu.Unlock()
		return err
	}
	if err := p.slot.loss(); err != nil {
		p.end(err) // p.err was nil: it is err now
		b.mu.Unlock()
		return err
	}
	p.end(ErrReleased)
	r := b.place(p.slot)
	b.mu.Unlock()
	if r != nil {
		if err := r.giveUp(ctx); err != nil {
			return fmt.Errorf("%s: %w", b.Name(), err)
		}
	}
	return nil
}

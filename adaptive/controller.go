package adaptive

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/tokensem/tokensem"
)

// Report is one process's sample of one window, as it travels to the
// controller (see a backend's report channel).
type Report struct {
	From   string // the reporting process, unique in the fleet
	Sample Sample
}

// Decision is what a controller did at the end of one window.
type Decision struct {
	At     time.Time
	Sample Sample // the fleet's, merged (see Controller.merge)
	From   int    // the permit count during the window
	To     int    // the count the controller chose (From: unchanged)
	Err    error  // the Resize to To failed
	// Permits is the count after the decision: To, or after a failed
	// resize, the count read back from the broker (a resize may fail
	// after it wrote the count), From if that read failed too.
	Permits int
	Reports int // how many reports the window merged
}

// Controller moves a semaphore's permit count after its fleet's reports,
// while it leads. Leading is holding Leader's one permit: of the
// controllers of one semaphore (one per process that may control it, say),
// one leads at a time, and another takes over within Leader's lease when
// the leader's process dies; meanwhile the count stays where it was.
//
// Every change goes through Resize, so a change is as safe as a resize:
// never more than max(old, new) valid holders while clients learn the new
// count. A leader that dies while it resizes leaves the semaphore's admin
// lock held until the lock expires (natssem: 15 s): the next leader's
// first resize waits for it (each resize is bounded, see resizeWindows),
// and the count stays meanwhile. A leader stops deciding once its permit
// is lost, and a resize it has under way is cancelled then (a leased
// permit is lost when its lease runs out unrenewed, before another
// controller can take it): the cancelled resize may still have written
// the count (its repair ends later), which the next leader reads. Two leaders can overlap by as long
// as a resize takes to notice its cancellation; no write is fenced by the
// lead. Fill in the fields, then call Run.
type Controller struct {
	// Leader is a one-permit semaphore beside the controlled one: whoever
	// holds its permit leads (should it be resized to more, only the
	// holder of permit 0: see Run).
	Leader tokensem.Semaphore
	// Resize sets the controlled semaphore's permit count (its backend's
	// Resize).
	Resize func(ctx context.Context, permits int) error
	// Permits returns the controlled semaphore's permit count as the
	// broker has it (its Status): where a new leader starts from.
	Permits func(ctx context.Context) (int, error)
	// Reports are the fleet's reports, one per process and window. While
	// another controller leads, this one feeds them to its Algorithm and
	// decides nothing (so that it starts to lead with what the algorithm
	// learnt, such as Gradient's baseline latency, rather than from
	// nothing); a report that came before it starts to lead is not part
	// of its first decision.
	Reports <-chan Report
	// Algorithm computes the next count; Bounds keep it in range and move
	// it by a bounded step.
	Algorithm Algorithm
	Bounds    Bounds
	// Window is how often the controller decides; default 1 s. Reporters
	// should report at the same period.
	Window time.Duration
	// Decided, if set, is called with each decision, from Run's goroutine
	// (for status and metrics): it must not block.
	Decided func(Decision)
	// Led, if set, is called when the controller begins to lead, with the
	// count it starts from, from Run's goroutine: it must not block.
	Led func(permits int)
	// Logger receives the controller's log (default: none).
	Logger *slog.Logger
}

// A resize may take resizeWindows windows, and at least minResizeWait: a
// resize waits for the semaphore's admin lock (which a leader that died
// while resizing holds until it expires: natssem 15 s), and its repair
// may wait for a holder's bound before it issues a token (amqpsem: W and
// a third, 10 s by default). One that takes longer fails, the count
// stays, and the next window decides again.
const (
	resizeWindows = 5
	minResizeWait = 30 * time.Second
)

// ErrNotLeading is returned by a lead that ended because the leader's
// permit was lost (see Controller.Run).
var ErrNotLeading = errors.New("adaptive: the controller's leader permit was lost")

func (c *Controller) check() error {
	switch {
	case c.Leader == nil || c.Resize == nil || c.Permits == nil || c.Reports == nil || c.Algorithm == nil:
		return fmt.Errorf("%w: a controller needs Leader, Resize, Permits, Reports and Algorithm", tokensem.ErrInvalidOption)
	case c.Window < 0:
		return fmt.Errorf("%w: window %v", tokensem.ErrInvalidOption, c.Window)
	}
	if err := c.Bounds.Validate(); err != nil {
		return fmt.Errorf("%w: %w", tokensem.ErrInvalidOption, err)
	}
	return nil
}

// Run waits to lead, leads until the leader's permit is lost, and waits
// again, until ctx ends; it returns ctx.Err(), at once an error wrapping
// tokensem.ErrInvalidOption for a controller missing a field, or an error
// of the wait to lead that waiting again cannot mend (the leader closed,
// not initialized, permission denied), or when Reports is closed. A
// controller given any permit of Leader but the first (permit 0: Leader
// was resized past one permit) gives it back and returns an error wrapping
// tokensem.ErrPermitMismatch without leading: the holder of permit 0
// leads on. Other errors are logged and tried again a window later.
func (c *Controller) Run(ctx context.Context) error {
	if err := c.check(); err != nil {
		return err
	}
	log := c.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	for {
		p, err := c.awaitLead(ctx)
		if err != nil {
			switch {
			case ctx.Err() != nil:
				return ctx.Err()
			case errors.Is(err, errReportsClosed):
				return err
			case errors.Is(err, tokensem.ErrClosed), errors.Is(err, tokensem.ErrNotInitialized),
				errors.Is(err, tokensem.ErrPermissionDenied):
				return fmt.Errorf("adaptive: waiting to lead: %w", err)
			}
			log.Warn("adaptive: waiting to lead failed; trying again", "error", err)
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(c.window()):
			}
			continue
		}
		if i := p.Token().Index; i != 0 {
			// Only the holder of the first permit leads: a leader
			// semaphore resized past one permit after its controllers
			// started would otherwise let a controller lead per permit.
			release(ctx, p)
			err := fmt.Errorf("adaptive: the leader semaphore has more than one permit (this controller was given permit %d): "+
				"only the holder of permit 0 leads; resize it to 1: %w", i, tokensem.ErrPermitMismatch)
			log.Error("adaptive: not leading", "error", err)
			return err
		}
		err = c.lead(ctx, p, log)
		release(ctx, p)
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, errReportsClosed):
			return err
		case errors.Is(err, ErrNotLeading):
			log.Warn("adaptive: lost the lead; the count stays until a controller leads", "error", p.Err())
		default: // the count could not be read: another may lead meanwhile
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(c.window()):
			}
		}
	}
}

func (c *Controller) window() time.Duration {
	if c.Window == 0 {
		return DefaultWindow
	}
	return c.Window
}

// awaitLead waits for the leader's permit, shadowing the leader meanwhile;
// a Reports channel closed meanwhile ends the wait with errReportsClosed.
func (c *Controller) awaitLead(ctx context.Context) (tokensem.Permit, error) {
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if !c.shadow(actx) {
			cancel(errReportsClosed)
		}
	}()
	p, err := c.Leader.Acquire(actx)
	cancel(nil) // ends the shadow
	<-done
	if errors.Is(context.Cause(actx), errReportsClosed) && err != nil {
		return nil, errReportsClosed
	}
	return p, err
}

// shadow feeds the Algorithm the fleet's windows, as the leader sees them,
// until ctx ends (true) or Reports is closed (false); it decides nothing.
// The sample's Limit is the largest count a report names (what the fleet
// last learnt).
func (c *Controller) shadow(ctx context.Context) bool {
	tick := time.NewTicker(c.window())
	defer tick.Stop()
	f := c.newFleet()
	for {
		select {
		case <-ctx.Done():
			return true
		case now := <-tick.C:
			reports, ok := c.drain()
			if !ok {
				return false
			}
			if len(reports) > 0 {
				c.Algorithm.Next(f.sample(now, reports))
			}
		}
	}
}

// release gives up the leader's permit, even after ctx ended.
func release(ctx context.Context, p tokensem.Permit) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tokensem.ReleaseTimeout)
	defer cancel()
	_ = p.Release(rctx)
}

// newFleet returns an empty fleet of c's window.
func (c *Controller) newFleet() fleet { return fleet{window: c.window(), busy: map[string]level{}} }

// lead decides once a window until ctx ends or p is lost.
func (c *Controller) lead(ctx context.Context, p tokensem.Permit, log *slog.Logger) error {
	if _, ok := c.drain(); !ok { // reports of windows before this lead
		return errReportsClosed
	}
	// The count reads end with the lead (one that waits out a broker
	// outage, say).
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-p.Done():
			cancel()
		case <-lctx.Done():
		}
	}()
	cur, err := c.Permits(lctx)
	if err != nil {
		log.Warn("adaptive: reading the count failed; leaving the lead", "error", err)
		return err
	}
	log.Info("adaptive: leading", "permits", cur)
	if c.Led != nil {
		c.Led(cur)
	}
	tick := time.NewTicker(c.window())
	defer tick.Stop()
	f := c.newFleet()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-p.Done():
			return ErrNotLeading
		case now := <-tick.C:
			reports, ok := c.drain()
			if !ok {
				return errReportsClosed
			}
			if len(reports) == 0 {
				continue // nobody held: nothing to learn
			}
			s := f.sample(now, reports)
			s.Limit = cur // what the count was, whatever a client still believed
			d := Decision{At: now, Sample: s, From: cur, To: c.Bounds.Apply(cur, c.Algorithm.Next(s)), Permits: cur, Reports: len(reports)}
			if d.To != cur {
				d.Err = c.resize(ctx, p, d.To)
				if d.Err != nil {
					log.Warn("adaptive: resize failed", "from", cur, "to", d.To, "error", d.Err)
					// It may have written the count before it failed:
					// decide from what the broker has.
					if n, err := c.Permits(lctx); err == nil {
						cur = n
					}
				} else {
					log.Info("adaptive: resized", "from", cur, "to", d.To, "rtt", s.RTT, "holds", s.Holds, "drops", s.Drops, "busy", s.Busy)
					cur = d.To
				}
				// The reports that came during the resize describe the
				// count before it: their holds are not counted, but
				// their Busy stands for their processes until those
				// report again.
				late, ok := c.drain()
				if !ok {
					return errReportsClosed
				}
				f.note(time.Now(), late)
				d.Permits = cur
				// A window's worth of ticks may have piled up during the
				// resize: the next window starts now.
				tick.Reset(c.window())
			}
			if c.Decided != nil {
				c.Decided(d)
			}
		}
	}
}

// resize resizes to n while p, the lead, is held: not at all once p is
// lost, and a resize under way is cancelled when p is lost (a leased
// permit is lost, and told so, when its lease runs out unrenewed: before
// another controller can take it). It is bounded by resizeWindows windows
// and at least minResizeWait.
func (c *Controller) resize(ctx context.Context, p tokensem.Permit, n int) error {
	rctx, cancel := context.WithTimeoutCause(ctx, max(minResizeWait, resizeWindows*c.window()), errResizeTimeout)
	defer cancel()
	rctx, cancelLost := context.WithCancelCause(rctx)
	defer cancelLost(nil)
	go func() {
		select {
		case <-p.Done():
			cancelLost(ErrNotLeading)
		case <-rctx.Done():
		}
	}()
	select {
	case <-p.Done():
		return ErrNotLeading
	default:
	}
	if err := c.Resize(rctx, n); err != nil {
		if cause := context.Cause(rctx); cause != nil && rctx.Err() != nil {
			return fmt.Errorf("%w (%w)", cause, err)
		}
		return err
	}
	return nil
}

// errReportsClosed ends a lead whose Reports channel was closed.
var errReportsClosed = errors.New("adaptive: the reports channel was closed")

// errResizeTimeout is the cause of a resize that outlasted its bound.
var errResizeTimeout = errors.New("adaptive: the resize took too long")

// drain returns the reports queued now; ok is false once the channel is
// closed.
func (c *Controller) drain() (_ []Report, ok bool) {
	var out []Report
	for {
		select {
		case r, ok := <-c.Reports:
			if !ok {
				return out, false
			}
			out = append(out, r)
		default:
			return out, true
		}
	}
}

// fleet is what a leading controller knows of its fleet's processes
// between windows. The processes report once a window each, on timers of
// their own, so the reports that reach one window of the controller's may
// miss a process whose report came a moment late (it comes in the next):
// its Busy, a level rather than a count of events, is then taken from its
// latest report, if that is less than one and a half windows old. (Busy
// serves only to tell a fleet that used its permits from one that did
// not: a level from a report that came during a resize, of the count
// before it, serves that.)
type fleet struct {
	window time.Duration
	busy   map[string]level // by Report.From
}

type level struct {
	busy float64
	at   time.Time
}

// sample merges the reports of the window that ends at now (merge); its
// Busy is the sum of the processes' levels: of the reports of this window
// (note), and the latest of each process that did not report in it.
func (f *fleet) sample(now time.Time, fresh []Report) Sample {
	s := merge(fresh)
	f.note(now, fresh)
	for from, l := range f.busy {
		if now.Sub(l.at) > f.window*3/2 {
			delete(f.busy, from)
			continue
		}
		s.Busy += l.busy
	}
	return s
}

// note keeps the Busy of each process that reported in reports as its
// level at now: the mean of its reports' Busy (a process that reported
// twice in a window, its timer and the controller's drifting apart).
func (f *fleet) note(now time.Time, reports []Report) {
	type sum struct {
		busy float64
		n    int
	}
	sums := map[string]sum{}
	for _, r := range reports {
		s := sums[r.From]
		sums[r.From] = sum{s.busy + r.Sample.Busy, s.n + 1}
	}
	for from, s := range sums {
		f.busy[from] = level{s.busy / float64(s.n), now}
	}
}

// merge sums one window's reports into the fleet's sample, Busy aside
// (fleet.sample): holds, drops and use add up.
func merge(reports []Report) Sample {
	var m Sample
	var use float64 // in nanoseconds: a sum of RTT × holds overflows int64
	for _, r := range reports {
		s := r.Sample
		m.Limit = max(m.Limit, s.Limit)
		m.Holds += s.Holds
		m.Drops += s.Drops
		use += float64(s.RTT) * float64(s.Holds)
	}
	if m.Holds > 0 {
		m.RTT = time.Duration(use / float64(m.Holds))
	}
	return m
}

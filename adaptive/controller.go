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
	At      time.Time
	Sample  Sample // the fleet's, merged (see Controller.merge)
	From    int    // the permit count during the window
	To      int    // the count the controller chose (From: unchanged)
	Err     error  // the Resize to To failed: the count stays From
	Reports int    // how many reports the window merged
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
// and the count stays meanwhile. A leader whose permit is lost stops deciding at once; one
// whose resize was under way at that moment may still land it. Fill in
// the fields, then call Run.
type Controller struct {
	// Leader is a one-permit semaphore beside the controlled one: whoever
	// holds its permit leads.
	Leader tokensem.Semaphore
	// Resize sets the controlled semaphore's permit count (its backend's
	// Resize).
	Resize func(ctx context.Context, permits int) error
	// Permits returns the controlled semaphore's permit count as the
	// broker has it (its Status): where a new leader starts from.
	Permits func(ctx context.Context) (int, error)
	// Reports are the fleet's reports, one per process and window. The
	// controller reads them only while it leads; a report older than a
	// window when it starts to lead is dropped.
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
// not initialized, permission denied). Other errors are logged and tried
// again a window later.
func (c *Controller) Run(ctx context.Context) error {
	if err := c.check(); err != nil {
		return err
	}
	log := c.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	for {
		p, err := c.Leader.Acquire(ctx)
		if err != nil {
			switch {
			case ctx.Err() != nil:
				return ctx.Err()
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
		err = c.lead(ctx, p, log)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tokensem.ReleaseTimeout)
		_ = p.Release(rctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
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
		return time.Second
	}
	return c.Window
}

// lead decides once a window until ctx ends or p is lost.
func (c *Controller) lead(ctx context.Context, p tokensem.Permit, log *slog.Logger) error {
	c.drain() // reports of windows before this lead
	cur, err := c.Permits(ctx)
	if err != nil {
		log.Warn("adaptive: reading the count failed; leaving the lead", "error", err)
		return err
	}
	log.Info("adaptive: leading", "permits", cur)
	tick := time.NewTicker(c.window())
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-p.Done():
			return ErrNotLeading
		case now := <-tick.C:
			reports := c.drain()
			if len(reports) == 0 {
				continue // nobody held: nothing to learn
			}
			s := merge(reports)
			s.Limit = cur // what the count was, whatever a client still believed
			d := Decision{At: now, Sample: s, From: cur, To: c.Bounds.Apply(cur, c.Algorithm.Next(s)), Reports: len(reports)}
			if d.To != cur {
				// The lead must still be ours: a controller that lost it
				// does not resize.
				select {
				case <-p.Done():
					return ErrNotLeading
				default:
				}
				rctx, cancel := context.WithTimeout(ctx, max(minResizeWait, resizeWindows*c.window()))
				d.Err = c.Resize(rctx, d.To)
				cancel()
				if d.Err != nil {
					log.Warn("adaptive: resize failed; the count stays", "from", cur, "to", d.To, "error", d.Err)
				} else {
					log.Info("adaptive: resized", "from", cur, "to", d.To, "rtt", s.RTT, "holds", s.Holds, "drops", s.Drops, "in_flight", s.InFlight)
					cur = d.To
				}
			}
			if c.Decided != nil {
				c.Decided(d)
			}
		}
	}
}

// drain returns the reports queued now.
func (c *Controller) drain() []Report {
	var out []Report
	for {
		select {
		case r := <-c.Reports:
			out = append(out, r)
		default:
			return out
		}
	}
}

// merge sums one window's reports into the fleet's sample: holds, drops
// and use add up; a process that reported twice in the window counts its
// larger peak once; the peaks of different processes add up (an upper
// bound: they need not coincide).
func merge(reports []Report) Sample {
	peaks := map[string]int{}
	var m Sample
	var use time.Duration
	for _, r := range reports {
		s := r.Sample
		peaks[r.From] = max(peaks[r.From], s.InFlight)
		m.Limit = max(m.Limit, s.Limit)
		m.Holds += s.Holds
		m.Drops += s.Drops
		use += s.RTT * time.Duration(s.Holds)
	}
	for _, p := range peaks {
		m.InFlight += p
	}
	if m.Holds > 0 {
		m.RTT = use / time.Duration(m.Holds)
	}
	return m
}

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/adaptive"
	"github.com/tokensem/tokensem/internal/ratelog"
)

// controlRecorder is a semaphore that keeps its controller's record
// (natssem and amqpsem: RecordController, ControllerRecord).
type controlRecorder interface {
	RecordController(ctx context.Context, r adaptive.Record) error
	ControllerRecord(ctx context.Context) (adaptive.Record, bool, error)
}

// recordKeeper keeps the leading controller's record on the broker, for
// seminit status: it writes it when the controller begins to lead and
// after each change of the count, in the background (the controller's
// callbacks must not block), the latest record winning. The first write
// of a lead keeps the changes the last leader recorded.
type recordKeeper struct {
	s       controlRecorder
	timeout time.Duration
	log     *slog.Logger
	warn    ratelog.Limited

	mu      sync.Mutex
	rec     adaptive.Record
	leading bool
	merge   bool // the stored record's changes are still to be kept
	kick    chan struct{}
}

func newRecordKeeper(s controlRecorder, base adaptive.Record, timeout time.Duration, log *slog.Logger) *recordKeeper {
	host, _ := os.Hostname()
	base.By = fmt.Sprintf("seminit adapt on %s (pid %d)", adaptive.Clip(host, 60), os.Getpid())
	return &recordKeeper{s: s, rec: base, timeout: timeout, log: log, kick: make(chan struct{}, 1)}
}

// led notes that the controller began to lead.
func (k *recordKeeper) led(at time.Time) {
	k.mu.Lock()
	k.rec.Since, k.rec.Changes, k.leading, k.merge = at, nil, true, true
	k.mu.Unlock()
	k.poke()
}

// lost notes that the controller no longer leads: it writes no more until
// it leads again.
func (k *recordKeeper) lost() {
	k.mu.Lock()
	k.leading = false
	k.mu.Unlock()
}

// changed notes a change of the count while leading.
func (k *recordKeeper) changed(c adaptive.Change) {
	k.mu.Lock()
	k.rec = k.rec.Add(c)
	k.mu.Unlock()
	k.poke()
}

func (k *recordKeeper) poke() {
	select {
	case k.kick <- struct{}{}:
	default:
	}
}

// recordRetry is how soon a record that could not be written is tried
// again.
const recordRetry = 2 * time.Second

// run writes the record each time it changed, and again after a write that
// failed, until ctx ends.
func (k *recordKeeper) run(ctx context.Context) {
	retry := time.NewTimer(0)
	<-retry.C
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-k.kick:
		case <-retry.C:
		}
		if err := k.write(ctx); err != nil && ctx.Err() == nil {
			k.warn.Warn(k.log, "could not record the controller for seminit status; it goes on controlling", "err", err)
			retry.Reset(recordRetry)
		}
	}
}

func (k *recordKeeper) write(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, k.timeout)
	defer cancel()
	k.mu.Lock()
	merge, leading := k.merge, k.leading
	k.mu.Unlock()
	if !leading {
		return nil
	}
	var prior []adaptive.Change
	if merge {
		old, ok, err := k.s.ControllerRecord(ctx)
		switch {
		case errors.Is(err, tokensem.ErrInvalidRecord):
			// Not a record (written by someone else): nothing to keep.
		case err != nil:
			return fmt.Errorf("reading the last controller's record: %w", err) // tried again
		case ok:
			prior = old.Changes
		}
	}
	k.mu.Lock()
	if merge {
		rec := adaptive.Record{Changes: prior}
		for _, c := range k.rec.Changes {
			rec = rec.Add(c)
		}
		k.rec.Changes, k.merge = rec.Changes, false
	}
	k.rec.At = time.Now()
	rec := k.rec
	k.mu.Unlock()
	return k.s.RecordController(ctx, rec)
}

// controllerView is a semaphore's controller as seminit status shows it:
// the record its leading controller keeps (see recordKeeper), and whether
// the leader semaphore is held now.
type controllerView struct {
	*adaptive.Record
	Leading *bool  `json:"leading,omitempty"`       // the leader semaphore is held now (absent: unknown)
	Holder  string `json:"leader_holder,omitempty"` // who holds it, when the backend can tell (NATS)
	Problem string `json:"problem,omitempty"`       // why the record or the leader could not be read
}

// readController reads the controller record of s and looks at its leader
// semaphore; nil when s keeps no record or has none.
func readController(ctx context.Context, g *globals, s statuser) *controllerView {
	cr, ok := s.(controlRecorder)
	if !ok {
		return nil
	}
	r, ok, err := cr.ControllerRecord(ctx)
	switch {
	case err != nil:
		return &controllerView{Problem: fmt.Sprintf("the controller record cannot be read: %v", err)}
	case !ok:
		return nil
	}
	v := &controllerView{Record: &r}
	leaders, done, err := openSemaphores(ctx, g, []string{r.Leader})
	if err != nil {
		v.Problem = fmt.Sprintf("the leader semaphore %s: %v", r.Leader, err)
		return v
	}
	defer done()
	st, err := leaders[0].Status(ctx)
	if err != nil {
		v.Problem = fmt.Sprintf("the leader semaphore %s: %v", r.Leader, err)
		return v
	}
	held := st.Held > 0
	v.Leading = &held
	if len(st.Holders) > 0 {
		v.Holder = st.Holders[0].Owner
	}
	return v
}

// print writes v as lines of seminit status.
func (v *controllerView) print(w io.Writer) {
	if v == nil {
		return
	}
	if v.Record == nil {
		fmt.Fprintf(w, "  controller: %s\n", v.Problem)
		return
	}
	r := v.Record
	switch {
	case v.Leading == nil:
		fmt.Fprintf(w, "  controller: %s, leading since %s by its record (%s)\n", r.By, r.Since.UTC().Format(time.RFC3339), v.Problem)
	case *v.Leading:
		by := ""
		if v.Holder != "" {
			by = " by " + v.Holder
		}
		fmt.Fprintf(w, "  controller: %s, leading since %s (leader semaphore %s held%s)\n", r.By, r.Since.UTC().Format(time.RFC3339), r.Leader, by)
	default:
		fmt.Fprintf(w, "  controller: none leads now (leader semaphore %s is free); the last was %s, recorded %s\n",
			r.Leader, r.By, r.At.UTC().Format(time.RFC3339))
	}
	alg := ""
	if r.Algorithm != "" {
		alg = ", " + r.Algorithm
	}
	fmt.Fprintf(w, "    counts %d..%d%s\n", r.Min, r.Max, alg)
	for _, c := range r.Changes {
		fmt.Fprintf(w, "    %s  %d → %d  %s\n", c.At.UTC().Format(time.RFC3339), c.From, c.To, c.Why)
	}
}

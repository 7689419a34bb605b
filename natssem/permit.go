package natssem

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/backoff"
	"github.com/tokensem/tokensem/internal/permitstate"
)

var _ tokensem.Permit = (*Permit)(nil)

// Permit is a held permit of a NATS semaphore. Its own goroutine renews it
// every third of the lease: first a compare-and-set of the slot record
// (which proves nobody took the slot over), then an in-progress ack that
// keeps the server from redelivering the token.
//
// The permit is held until its Deadline: the send time of its last
// successful record write plus the lease minus lease/5. Another client can take
// the slot over only once the record is a whole lease old by the server's
// clock, and the server stamps a write after it was sent, so Done closes
// before anyone else can hold the slot.
type Permit struct {
	s     *Semaphore
	d     delivery // the claimed delivery and the record that claimed it
	fence uint64
	lease time.Duration

	life *permitstate.State // held, then released or lost

	mu       sync.Mutex
	rev      uint64
	deadline time.Time
	ctx      context.Context // cancelled when Release stops the renewals
	stop     context.CancelFunc
	// start runs the renewals (run) when the first is due: until then a
	// permit is a timer, not a goroutine, and a Release before it (most
	// holds are shorter than a third of the lease) neither starts a
	// goroutine nor waits for one to end.
	start  *time.Timer   // nil for a permit lost as it was made
	exited chan struct{} // closed when run has returned, or will never run
}

// newPermit starts the life of a permit whose claim write (d.rec, sent at
// d.sent) landed at revision rev. A permit made after its deadline is lost
// before it is returned.
func (s *Semaphore) newPermit(d delivery, rev uint64, lease time.Duration) *Permit {
	p := &Permit{
		s: s, d: d, fence: rev, lease: lease, rev: rev, deadline: deadline(d.sent, lease),
		life: permitstate.New(s.opts.Observer, s.name, s.Permits()), exited: make(chan struct{}),
	}
	p.ctx, p.stop = context.WithCancel(context.Background())
	if !time.Now().Before(p.deadline) {
		// Lost before it is returned: its holder is told so, and nothing
		// of it renews the record (a renewal racing the deadline's
		// timer could win and renew a permit nobody holds).
		p.lose(errLeaseExpired)
		p.stop()
		close(p.exited)
		return p
	}
	s.log.Debug("permit acquired", "index", d.tok.Index, "fence", rev)
	// The first renewal is due a renewal interval after the claim write
	// was sent, however long the claim took to answer.
	p.start = time.AfterFunc(time.Until(d.sent.Add(renewEvery(lease))), p.run)
	return p
}

// Done is closed when the permit is released or lost.
func (p *Permit) Done() <-chan struct{} { return p.life.Done() }

// Err is nil while held, tokensem.ErrReleased after Release, and wraps
// tokensem.ErrLeaseLost with its cause after a loss.
func (p *Permit) Err() error { return p.life.Err() }

// ReportUse records how the holder's use of the permit went, for the
// Observer's EventRelease or EventLost (see tokensem.ReportUse).
func (p *Permit) ReportUse(took time.Duration, overloaded bool) { p.life.ReportUse(took, overloaded) }

// Token returns the held token.
func (p *Permit) Token() tokensem.Token { return p.d.tok }

// Fence returns the KV revision of the write that acquired the slot; it
// grows every time the slot changes hands.
func (p *Permit) Fence() uint64 { return p.fence }

// Deadline returns the local time after which the permit is lost unless a
// renewal succeeds first.
func (p *Permit) Deadline() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.deadline
}

func (p *Permit) run() {
	defer close(p.exited)
	defer p.stop()
	if p.ctx.Err() != nil {
		return // Release came first
	}
	interval, retry := renewEvery(p.lease), retryEvery(p.lease)
	// Started when the first renewal is due (newPermit): at once.
	renew := time.NewTimer(time.Until(p.d.sent.Add(interval)))
	defer renew.Stop()
	expire := time.NewTimer(time.Until(p.Deadline()))
	defer expire.Stop()
	var lastErr error
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-expire.C:
			p.lose(fmt.Errorf("%w (last error: %v)", errLeaseExpired, lastErr))
			return
		case <-renew.C:
			// The renewal runs beside the deadline's timer: a call that
			// blocks past its context (a write to a stalled link) must not
			// keep the holder from being told at its deadline (a chaos run
			// saw a permit told 470 ms after it, when its link came back).
			// The renewal is waited for after the loss: it is this
			// goroutine's, and anything it still writes only makes the
			// slot look held for longer.
			res := make(chan error, 1)
			go func() { res <- p.renew() }()
			var err error
			select {
			case err = <-res:
			case <-expire.C:
				p.lose(fmt.Errorf("%w (a renewal still unanswered)", errLeaseExpired))
				p.stop()
				<-res
				return
			}
			if o := p.s.opts.Observer; o != nil {
				o.Observe(tokensem.Event{Kind: tokensem.EventRenew, Semaphore: p.s.name, Permits: p.s.Permits(), Err: err})
			}
			switch {
			case err == nil:
				expire.Reset(time.Until(p.Deadline()))
				renew.Reset(interval)
			case errors.Is(err, errTakenOver), errors.Is(err, errDeleted), errors.Is(err, nats.ErrConnectionClosed):
				p.lose(err)
				return
			case answered(err) && p.s.gone(p.ctx, p.Deadline()):
				p.lose(fmt.Errorf("%w (renewal: %v)", errDeleted, err))
				return
			default:
				lastErr = err
				p.s.log.Warn("permit renewal failed; retrying", "index", p.d.tok.Index, "err", err)
				renew.Reset(retry)
			}
		}
	}
}

// renew rewrites the slot record (compare-and-set on our revision) and then
// tells the server the delivery is still in progress. The deadline moves
// only by a write that is known to have landed.
func (p *Permit) renew() error {
	ctx, cancel := context.WithDeadline(p.ctx, p.Deadline())
	defer cancel()
	sent := time.Now()
	if err := p.write(ctx, p.d.rec); err != nil {
		return err
	}
	p.mu.Lock()
	p.deadline = deadline(sent, p.lease)
	p.mu.Unlock()
	return wrapBrokerErr(p.s.nc.Publish(p.d.reply, ackProgress))
}

// write replaces the slot record by compare-and-set on the permit's
// revision. A conflict or an unanswered write is resolved by reading the
// record: if it still names this permit's holder, an earlier write of ours
// landed unseen, so we retry at its revision (a renewal must land now to
// move the deadline); if it is free and released by us, our release landed;
// otherwise the slot was taken over. A record older than the permit's own
// revision comes from a replica that has not applied our last write yet
// (the read is a direct get, see docs/nats-cluster-facts.md): it tells of
// no change, so the write is tried again, for a while (as awaitRelease
// waits for a replica), before it counts as a takeover.
func (p *Permit) write(ctx context.Context, rec record) error {
	bound, pause := p.s.replicaWait()
	lagging := time.Now().Add(bound)
	for attempt := 0; attempt < 3; attempt++ {
		p.mu.Lock()
		rev := p.rev
		p.mu.Unlock()
		newRev, err := p.s.slots.cas(ctx, p.d.tok.Index, rec, rev, p.d.delivered)
		if err == nil {
			p.setRev(newRev)
			return nil
		}
		got, rerr := p.s.slots.read(ctx, p.d.tok.Index)
		if rerr != nil {
			return fmt.Errorf("%w (reading the record after: %w)", err, rerr)
		}
		if got.rev < rev && time.Now().Before(lagging) {
			p.s.log.Debug("slot record read from a replica behind our own write; writing again", "index", p.d.tok.Index,
				"rev", rev, "read_rev", got.rev, "err", err)
			if werr := pause.Wait(ctx, nil); werr != nil {
				return fmt.Errorf("%w (waiting to write again: %w)", err, werr)
			}
			attempt--
			continue
		}
		switch {
		case got.rec.Deleted:
			// Closed by a Delete (it keeps the holder's name, so this
			// comes first): writing over it would reopen the slot.
			return fmt.Errorf("%w (ForceDelete closed its slot)", errDeleted)
		case rec.free() && got.rec.free() && got.rec.By == p.d.holder:
			p.setRev(got.rev)
			return nil
		case got.rec.Holder == p.d.holder && got.rev == rev && !errors.Is(err, errConflict):
			// Unanswered (an election: a replica answers the read, no
			// leader the write), and nothing changed: the caller retries
			// the broker error. Counted as a change, three such answers
			// gave a release up as "keeps changing" on a loaded machine.
			return err
		case got.rec.Holder == p.d.holder:
			p.setRev(got.rev)
		default:
			return fmt.Errorf("%w: record now held by %q at revision %d", errTakenOver, got.rec.Owner, got.rev)
		}
	}
	return fmt.Errorf("natssem: slot record of %s keeps changing", p.d.tok)
}

// free writes the free record for Release, retrying a broker that does not
// answer until ctx ends or the deadline passes. The error is the cause of
// the loss when it fails.
func (p *Permit) free(ctx context.Context) error {
	rec := record{Epoch: p.d.tok.Epoch, Seq: p.d.seq, Token: p.d.tok.ID, By: p.d.holder}
	wctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), p.Deadline())
	defer cancel()
	pause := backoff.Backoff{Min: 20 * time.Millisecond, Max: max(20*time.Millisecond, retryEvery(p.lease))}
	for {
		err := p.write(wctx, rec)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, errTakenOver), errors.Is(err, errDeleted):
			return err
		case !transient(err) || ctx.Err() != nil || wctx.Err() != nil:
			return fmt.Errorf("release not confirmed, token returns after the lease: %w", err)
		}
		p.s.log.Warn("release not answered; retrying", "index", p.d.tok.Index, "err", err)
		if pause.Wait(wctx, ctx.Done()) != nil {
			return fmt.Errorf("release not confirmed, token returns after the lease: %w", err)
		}
	}
}

func (p *Permit) setRev(rev uint64) {
	p.mu.Lock()
	p.rev = rev
	p.mu.Unlock()
}

func (p *Permit) lose(cause error) {
	if p.life.Lose(p.d.tok, cause) {
		p.s.log.Warn("permit lost", "index", p.d.tok.Index, "fence", p.fence, "cause", cause)
	}
}

// stopRenewals stops the renewals for good and returns once none runs:
// after it, nothing of this permit writes its record but the caller.
func (p *Permit) stopRenewals() {
	p.stop()
	if p.start != nil && p.start.Stop() {
		close(p.exited) // the renewals never started, and now never will
	}
	<-p.exited
}

// Release frees the slot record by compare-and-set and only then hands the
// token to the next waiter (Nak). A permit that was lost is not touched: its
// token may already belong to someone else. A broker that does not answer
// (an election) is retried until ctx ends or the permit's deadline passes,
// whichever comes first; one attempt is made even when ctx is already done
// (bounded by the request timeout), so `defer p.Release(ctx)` works after
// ctx ends.
//
// Errors: tokensem.ErrReleased (second call), an error wrapping
// tokensem.ErrLeaseLost, or a broker error (the permit is then given up and
// its token returns to the semaphore within one lease).
func (p *Permit) Release(ctx context.Context) error {
	if err := p.life.BeginRelease(); err != nil {
		return err
	}
	p.stopRenewals()
	if err := p.Err(); err != nil {
		return err // lost while the renewals stopped
	}
	if time.Now().After(p.Deadline()) {
		p.lose(errLeaseExpired)
		return p.Err()
	}

	if err := p.free(ctx); err != nil {
		p.lose(err)
		return p.Err()
	}
	// The record is free and was ours until now: only now may the token go.
	if err := p.s.returned.nak(p.d.reply); err != nil {
		p.s.log.Warn("released, but the token's hand-back failed; it returns after the lease", "err", err)
	}
	p.s.log.Debug("permit released", "index", p.d.tok.Index)
	return p.life.Released()
}

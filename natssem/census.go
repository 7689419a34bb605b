package natssem

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/driver"
)

// storedToken is one message of the token stream, read without consuming
// it (held tokens included).
type storedToken struct {
	Seq  uint64
	Data []byte
}

// scanBatch is how many messages one direct-get batch returns.
const scanBatch = 1000

// scanTokens reads every message of the token stream with batched direct
// gets: non-destructive, and it sees held (unacked) tokens too.
func (s *Semaphore) scanTokens(ctx context.Context) ([]storedToken, error) {
	inbox := s.nc.NewInbox()
	// A channel of our own: SubscribeSync allocates the connection's
	// default of 64Ki slots (512 KiB, 8% of a group key's Init in a CPU
	// profile). A batch is at most scanBatch messages and its status, and
	// the next is asked for only after that status, so this never fills.
	msgs := make(chan *nats.Msg, scanBatch+1)
	sub, err := s.nc.ChanSubscribe(inbox, msgs)
	if err != nil {
		return nil, wrapBrokerErr(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	subj := "$JS.API.DIRECT.GET." + s.lay.stream
	var out []storedToken
	next := uint64(1)
	for {
		// By subject also alone: it selects the key's tokens among a
		// group's, and without it nats-server 2.11 answers a batch from a
		// sequence the stream no longer holds (seq 1: the stream starts
		// at its life's first sequence) with 404 rather than from the
		// next message, and Status read no token at all.
		req := mustMarshal(struct {
			Seq   uint64 `json:"seq"`
			Batch int    `json:"batch"`
			Subj  string `json:"next_by_subj"`
		}{next, scanBatch, s.lay.subject})
		if err := s.nc.PublishRequest(subj, inbox, req); err != nil {
			return nil, wrapBrokerErr(err)
		}
		more := false
	batch:
		for {
			m, err := s.nextScanned(ctx, msgs)
			if err != nil {
				return nil, fmt.Errorf("natssem: reading tokens of %s: %w", s.name, err)
			}
			code, desc := status(m)
			switch code {
			case "":
				seq, err := strconv.ParseUint(m.Header.Get("Nats-Sequence"), 10, 64)
				if err != nil {
					return nil, fmt.Errorf("natssem: direct get without a sequence: %w", err)
				}
				out = append(out, storedToken{Seq: seq, Data: m.Data})
				next = seq + 1
			case "204": // end of this batch
				more = m.Header.Get("Nats-Num-Pending") != "0"
				break batch
			case "404": // nothing (more) to read
				break batch
			case "503":
				return nil, s.noDirectGet(ctx)
			default:
				return nil, fmt.Errorf("natssem: direct get answered %s %s", code, desc)
			}
		}
		if !more {
			return out, nil
		}
	}
}

// noDirectGet explains a direct get that nobody answered (503): the token
// stream is gone (tokensem.ErrNotInitialized), or its replicas' direct-get
// subscriptions have not reached this client's server yet, as right after
// a replicated stream is made through another server of a cluster (a
// broker error, which the callers that retry ask again).
func (s *Semaphore) noDirectGet(ctx context.Context) error {
	rctx, cancel := s.rtt(ctx)
	defer cancel()
	_, err := s.js.Stream(rctx, s.lay.stream)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return fmt.Errorf("natssem: %s has no token stream: %w", s.name, tokensem.ErrNotInitialized)
	case err != nil:
		return wrapBrokerErr(fmt.Errorf("reading tokens of %s: no direct get answered, and the stream's info: %w", s.name, err))
	}
	return wrapBrokerErr(fmt.Errorf("reading tokens of %s: no server answers direct gets of its stream yet: %w", s.name, nats.ErrNoResponders))
}

// nextScanned waits for the next answer of a scan, at most a request
// timeout (a connection that closes meanwhile is noticed at its end: a
// channel subscription is not told).
func (s *Semaphore) nextScanned(ctx context.Context, msgs <-chan *nats.Msg) (*nats.Msg, error) {
	rctx, cancel := s.rtt(ctx)
	defer cancel()
	select {
	case m := <-msgs:
		return m, nil
	case <-rctx.Done():
		if s.nc.IsClosed() {
			return nil, nats.ErrConnectionClosed
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		// The broker was silent for a request timeout: transient, so the
		// callers that retry (Init, Status, Delete) ask again.
		return nil, wrapBrokerErr(nats.ErrTimeout)
	}
}

// Status takes a census: every token message (parsed and checked against
// the configuration and signing key), every slot record, and the consumer's
// queue of waiters. A broker that does not answer for a while (an election)
// is retried until ctx ends.
//
// Errors: tokensem.ErrClosed, tokensem.ErrNotInitialized, or a wrapped
// broker error.
func (s *Semaphore) Status(ctx context.Context) (st tokensem.Status, err error) {
	err = s.retry(ctx, "status", func() error {
		st, err = s.status(ctx)
		if transient(err) && answered(err) && s.gone(ctx, time.Now().Add(s.requestTimeout())) {
			// A handle of a deleted semaphore is answered "no responders".
			return fmt.Errorf("%w: %s was deleted", tokensem.ErrNotInitialized, s.name)
		}
		return err
	})
	return st, err
}

// status is one try of Status.
func (s *Semaphore) status(ctx context.Context) (tokensem.Status, error) {
	inv := s.Inventory()
	c, err := inv.census(ctx)
	if err != nil {
		return tokensem.Status{}, err
	}
	cons, err := s.consumerInfo(ctx)
	if err != nil {
		return tokensem.Status{}, err
	}
	st := driver.Summarize(c)
	st.Name, st.Backend, st.Resource = s.name, "nats", s.lay.stream
	st.Lease, st.Waiting = inv.cfg.Lease, cons.NumWaiting
	if w := ackWaitWarning(cons.Config.AckWait, inv.cfg.Lease); w != "" {
		st.Warnings = append(st.Warnings, w)
	}
	if inv.cfg.State == stateDeleting {
		st.Warnings = append(st.Warnings, "a Delete is running, or was cut short: Acquire waits until it ends "+
			"(seminit delete, or an Init of the same name, finishes it)")
	}
	var invalid, marked []int
	for idx, sl := range inv.slots {
		if sl.invalid {
			invalid = append(invalid, idx)
		}
		if sl.rec.Deleted && inv.cfg.State != stateDeleting {
			marked = append(marked, idx)
		}
	}
	if len(marked) > 0 {
		// Nothing this package writes: a Delete marks the configuration
		// before it closes a slot, and reopens the slots before it
		// unmarks it. A client's rights suffice to write one.
		slices.Sort(marked)
		st.Warnings = append(st.Warnings, fmt.Sprintf("the records of slots %v are marked deleted while no Delete runs "+
			"(written by someone else): the mark is ignored, and the next claim of each slot writes its record over", clipInts(marked)))
	}
	if len(invalid) > 0 {
		slices.Sort(invalid)
		st.Warnings = append(st.Warnings, fmt.Sprintf("the records of slots %v are invalid (not records this client writes, or over %d bytes): "+
			"they count as free, and the next claim of each slot replaces its record", clipInts(invalid), maxRecordSize))
	}
	for _, idx := range c.HeldSlots {
		sl := inv.slots[idx]
		st.Holders = append(st.Holders, tokensem.Holder{Index: idx, Owner: sl.rec.Owner, Since: sl.written})
	}
	slices.SortFunc(st.Holders, func(a, b tokensem.Holder) int { return a.Index - b.Index })
	return st, nil
}

// ackWaitWarning says what is wrong when the holders consumer's AckWait is
// not the lease stored in the configuration, which Init made it: someone
// edited the consumer. The slot records still decide who holds a slot, so
// no slot is held twice, but a shorter AckWait redelivers held tokens to
// waiters that must then wait, and a longer one brings a dead holder's
// token back late.
func ackWaitWarning(ackWait, lease time.Duration) string {
	if ackWait == lease {
		return ""
	}
	return fmt.Sprintf("the holders consumer's AckWait is %v but the semaphore's lease is %v (the consumer was changed after Init): put AckWait back to %v", ackWait, lease, lease)
}

// Count reads the slot records and the holders consumer's info (two
// round trips, no token read): slots whose record names a live holder are
// held, the rest of the permits available, and queued pulls are waiters.
// The consumer's own ack-pending count is no help: a released token stays
// in it until it is delivered again. A pull whose caller got its permit
// through another pull is counted until it expires. See tokensem.Count for
// what it cannot tell.
//
// Errors: tokensem.ErrClosed, tokensem.ErrNotInitialized, or a wrapped
// broker error.
func (s *Semaphore) Count(ctx context.Context) (tokensem.Count, error) {
	if s.isClosed() {
		return tokensem.Count{}, tokensem.ErrClosed
	}
	cfg, err := s.freshConfig(ctx)
	if err != nil {
		return tokensem.Count{}, err
	}
	slots, err := s.slots.readAll(ctx)
	if err != nil {
		return tokensem.Count{}, err
	}
	info, err := s.consumerInfo(ctx)
	if err != nil {
		return tokensem.Count{}, err
	}
	now := info.TimeStamp // as serverNow
	held := 0
	for idx, sl := range slots {
		if idx < cfg.Permits && sl.heldIn(cfg, now) {
			held++
		}
	}
	return tokensem.Count{Permits: cfg.Permits, Available: max(0, cfg.Permits-held), Held: held, Waiting: info.NumWaiting}, nil
}

// clipInts returns at most the first 16 of xs, for a message.
func clipInts(xs []int) string {
	if len(xs) <= 16 {
		return fmt.Sprint(xs)
	}
	return fmt.Sprintf("%v… (%d in all)", xs[:16], len(xs))
}

package natssem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem"
)

// StoredToken is one message of the token stream, read without consuming
// it (held tokens included).
type StoredToken struct {
	Seq  uint64
	Data []byte
}

// scanBatch is how many messages one direct-get batch returns.
const scanBatch = 1000

// scanTokens reads every message of the token stream with batched direct
// gets: non-destructive, and it sees held (unacked) tokens too.
func (s *Semaphore) scanTokens(ctx context.Context) ([]StoredToken, error) {
	inbox := s.nc.NewInbox()
	sub, err := s.nc.SubscribeSync(inbox)
	if err != nil {
		return nil, wrapBrokerErr(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	subj := "$JS.API.DIRECT.GET." + StreamName(s.name)
	var out []StoredToken
	next := uint64(1)
	for {
		req, _ := json.Marshal(map[string]any{"seq": next, "batch": scanBatch})
		if err := s.nc.PublishRequest(subj, inbox, req); err != nil {
			return nil, wrapBrokerErr(err)
		}
		more := false
	batch:
		for {
			rctx, cancel := s.rtt(ctx)
			m, err := sub.NextMsgWithContext(rctx)
			cancel()
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
				out = append(out, StoredToken{Seq: seq, Data: m.Data})
				next = seq + 1
			case "204": // end of this batch
				more = m.Header.Get("Nats-Num-Pending") != "0"
				break batch
			case "404": // nothing (more) to read
				break batch
			case "503":
				return nil, fmt.Errorf("natssem: %s has no token stream: %w", s.name, tokensem.ErrNotInitialized)
			default:
				return nil, fmt.Errorf("natssem: direct get answered %s %s", code, desc)
			}
		}
		if !more {
			return out, nil
		}
	}
}

// slotState is one slot record as found by a census.
type slotState struct {
	rec     record
	rev     uint64
	written time.Time
}

// readSlots reads every slot record.
func (s *Semaphore) readSlots(ctx context.Context) (map[int]slotState, error) {
	rctx, cancel := s.rtt(ctx)
	defer cancel()
	w, err := s.kv.Watch(rctx, slotPrefix+">", jetstream.IgnoreDeletes())
	if err != nil {
		return nil, wrapBrokerErr(err)
	}
	defer func() { _ = w.Stop() }()
	out := make(map[int]slotState)
	for {
		select {
		case <-rctx.Done():
			return nil, fmt.Errorf("natssem: reading slot records: %w", rctx.Err())
		case e := <-w.Updates():
			if e == nil {
				return out, nil // initial values done
			}
			idx, err := strconv.Atoi(strings.TrimPrefix(e.Key(), slotPrefix))
			if err != nil {
				continue
			}
			rec, err := decodeRecord(e.Value())
			if err != nil {
				continue
			}
			out[idx] = slotState{rec: rec, rev: e.Revision(), written: e.Created()}
		}
	}
}

// Status takes a census: every token message (parsed and checked against
// the configuration and signing key), every slot record, and the consumer's
// queue of waiters.
//
// Errors: tokensem.ErrClosed, tokensem.ErrNotInitialized, or a wrapped
// broker error.
func (s *Semaphore) Status(ctx context.Context) (tokensem.Status, error) {
	if s.isClosed() {
		return tokensem.Status{}, tokensem.ErrClosed
	}
	cfg, err := s.refreshConfig(ctx)
	if err != nil {
		return tokensem.Status{}, err
	}
	msgs, err := s.scanTokens(ctx)
	if err != nil {
		return tokensem.Status{}, err
	}
	slots, err := s.readSlots(ctx)
	if err != nil {
		return tokensem.Status{}, err
	}
	rctx, cancel := s.rtt(ctx)
	defer cancel()
	c, err := s.js.Consumer(rctx, StreamName(s.name), consumerName)
	if err != nil {
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			return tokensem.Status{}, fmt.Errorf("%w: %s has no consumer", tokensem.ErrNotInitialized, s.name)
		}
		return tokensem.Status{}, wrapBrokerErr(err)
	}
	info := c.CachedInfo()

	st := tokensem.Status{
		Name: s.name, Backend: "nats", Stream: StreamName(s.name),
		Permits: cfg.Permits, Epoch: cfg.Epoch, Lease: cfg.Lease,
		Tokens: len(msgs), Waiting: info.NumWaiting,
		Duplicate: []int{}, Missing: []int{},
	}
	present := make(map[int]int, cfg.Permits)
	for _, m := range msgs {
		tok, err := s.codec.Decode(m.Data)
		if err != nil || tok.Semaphore != s.name || tok.Epoch != cfg.Epoch || tok.Index >= cfg.Permits {
			st.Invalid++
			continue
		}
		present[tok.Index]++
	}
	for i := 0; i < cfg.Permits; i++ {
		switch n := present[i]; {
		case n == 0:
			st.Missing = append(st.Missing, i)
		case n > 1:
			st.Duplicate = append(st.Duplicate, i)
		}
	}
	heldIdx := make(map[int]bool)
	for idx, sl := range slots {
		if sl.rec.free() || idx >= cfg.Permits || info.TimeStamp.Sub(sl.written) >= cfg.Lease {
			continue
		}
		heldIdx[idx] = true
		st.Held++
		st.Holders = append(st.Holders, tokensem.Holder{Index: idx, Owner: sl.rec.Owner, Revision: sl.rev, Since: sl.written})
	}
	slices.SortFunc(st.Holders, func(a, b tokensem.Holder) int { return a.Index - b.Index })
	for idx := range present {
		if !heldIdx[idx] {
			st.Available++
		}
	}
	st.Healthy = st.Tokens == cfg.Permits && len(st.Duplicate) == 0 && len(st.Missing) == 0 && st.Invalid == 0
	return st, nil
}

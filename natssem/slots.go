package natssem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/ids"
	"github.com/tokensem/tokensem/internal/semopts"
	"github.com/tokensem/tokensem/internal/stored"
)

// slotPrefix starts the KV key of every slot record.
const slotPrefix = "slot."

// record is a slot's lease record, stored under layout.slotKey(index). It,
// not the token delivery, decides who holds the slot: a delivery becomes a
// permit only by a compare-and-set of this record, and its KV revision is
// the fencing number. Holder is empty when the slot is free.
//
// Epoch names the life of the semaphore (config.Epoch) the record was
// written in. A record of another life is a leftover of a client that
// acted on an ended life (see claim): it binds nobody of this life.
type record struct {
	Epoch  uint64 `json:"e,omitempty"`
	Holder string `json:"h,omitempty"` // unique id of the holding acquire
	Owner  string `json:"o,omitempty"` // holder's name, for Status
	Seq    uint64 `json:"seq"`         // stream sequence of the held (or last held) token
	Token  string `json:"tok,omitempty"`
	By     string `json:"by,omitempty"` // on a free record: the holder that released it
	// Deleted marks a slot that Delete closed: no claim takes it, and a
	// holder's renewal fails on it (see delete.go). The record keeps its
	// holder, if any.
	Deleted bool `json:"del,omitempty"`
	// Pending marks a claim that created the record and has not yet
	// confirmed its life (claim.go, lifeChecked); its holder's first
	// renewal writes the record without it.
	Pending bool `json:"p,omitempty"`
}

func (r record) free() bool { return r.Holder == "" }

func (r record) encode() []byte {
	b, err := json.Marshal(r)
	if err != nil {
		panic(err) // a struct of strings and ints always marshals
	}
	return b
}

// maxRecordSize caps a stored slot or lock record: the largest this
// package writes, with a holder name of 128 bytes each escaped in JSON, is
// about 1.1 KiB. A larger record is refused unparsed.
const maxRecordSize = 4 << 10

// decodeRecord parses and checks a slot record. Errors wrap
// tokensem.ErrInvalidRecord.
func decodeRecord(b []byte) (record, error) {
	var r record
	if len(b) == 0 {
		return r, nil
	}
	if err := stored.Decode(b, maxRecordSize, &r); err != nil {
		return record{}, err
	}
	if err := r.check(); err != nil {
		return record{}, fmt.Errorf("%w: %s", err, stored.Clip(b))
	}
	return r, nil
}

// check checks the fields of a slot record read back: what it names is
// quoted in errors and Status, so it is as short as what clients write.
func (r record) check() error {
	if r.Epoch >= ids.MaxEpoch {
		return stored.Invalid("slot record of epoch %d, not below 2^53", r.Epoch)
	}
	for _, f := range []struct {
		name, s string
		max     int
	}{{"holder", r.Holder, 64}, {"owner", r.Owner, semopts.MaxHolderName}, {"token", r.Token, 64}, {"by", r.By, 64}} {
		if err := stored.Len(f.name, f.s, f.max); err != nil {
			return err
		}
	}
	return nil
}

// slotIndex parses the index of a slot record's key suffix: a number in
// [0, tokensem.MaxPermits), written as strconv.Itoa writes it.
func slotIndex(suffix string) (int, bool) {
	idx, err := strconv.Atoi(suffix)
	return idx, err == nil && idx >= 0 && idx < tokensem.MaxPermits && strconv.Itoa(idx) == suffix
}

// slotEntry is one slot record as read from the bucket, or as this client
// wrote it.
type slotEntry struct {
	rec     record
	rev     uint64    // KV revision; 0: never written
	written time.Time // server time of the write; zero for our own writes
	// delivered is the token's delivery count when this client wrote the
	// record (0 for reads): see slotStore.cached.
	delivered uint64
	// invalid marks a record that did not decode (decodeRecord): rec is
	// then a free record, held by nobody we know.
	invalid bool
}

// live reports whether the entry names a holder that may still hold the
// slot at server time now. A holder gives up at its deadline, before its
// last write is a lease old by the server's clock (see deadline), so a
// held record written a whole lease ago belongs to nobody. Claim and
// census apply this one rule.
func (e slotEntry) live(now time.Time, lease time.Duration) bool {
	return !e.rec.free() && now.Sub(e.written) < lease
}

// heldIn reports whether the entry names a live holder of the life cfg
// describes (at server time now). A record of another life binds nobody in
// this one (see claim.go, lifeChecked).
func (e slotEntry) heldIn(cfg config, now time.Time) bool {
	return e.rec.Epoch == cfg.Epoch && e.live(now, cfg.Lease)
}

// ofLife reports whether the entry was written in the life epoch names, or
// never written.
func (e slotEntry) ofLife(epoch uint64) bool { return e.rev == 0 || e.rec.Epoch == epoch }

// errConflict is what a compare-and-set of a slot record returns when the
// record changed since the revision it was given: someone else wrote
// first. Single-node and replicated buckets report that with different
// error codes; slotStore.cas turns both into this one error.
var errConflict = errors.New("natssem: slot record changed meanwhile")

// slotStore reads and writes the slot records of one semaphore, and
// remembers the latest record this client saw of each slot.
type slotStore struct {
	kv      jetstream.KeyValue
	lay     layout
	timeout func() time.Duration // bounds each round trip
	log     *slog.Logger

	mu    sync.Mutex
	cache map[int]slotEntry
}

func newSlotStore(kv jetstream.KeyValue, lay layout, timeout func() time.Duration, log *slog.Logger) *slotStore {
	return &slotStore{kv: kv, lay: lay, timeout: timeout, log: log, cache: make(map[int]slotEntry)}
}

// read reads a slot's record. A slot never written reads as free at
// revision 0.
func (st *slotStore) read(ctx context.Context, index int) (slotEntry, error) {
	rctx, cancel := context.WithTimeout(ctx, st.timeout())
	defer cancel()
	e, err := st.kv.Get(rctx, st.lay.slotKey(index))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return slotEntry{}, nil
	case err != nil:
		return slotEntry{}, wrapBrokerErr(err)
	}
	rec, err := decodeRecord(e.Value())
	if err != nil {
		// A corrupt record is treated as held by nobody we know; only a
		// compare-and-set against its revision can replace it.
		st.log.Warn("corrupt slot record", "index", index, "err", err)
		rec = record{}
	}
	got := slotEntry{rec: rec, rev: e.Revision(), written: e.Created(), invalid: err != nil}
	st.remember(index, got)
	return got, nil
}

// cas writes rec to the slot's record if its revision is still rev (0: the
// record must not exist), and returns the new revision: the fence of a
// claim. It returns errConflict when someone else wrote first, and a broker
// error when the outcome is unknown (the write may have landed). delivered
// is the token's delivery count at this write (0 when no delivery is
// involved). ctx bounds the write together with the store's timeout;
// callers that must learn the outcome even after their caller gave up pass
// a context.WithoutCancel.
func (st *slotStore) cas(ctx context.Context, index int, rec record, rev, delivered uint64) (uint64, error) {
	rctx, cancel := context.WithTimeout(ctx, st.timeout())
	defer cancel()
	newRev, err := st.kv.Update(rctx, st.lay.slotKey(index), rec.encode(), rev)
	switch {
	case errors.Is(err, jetstream.ErrKeyRevisionMismatch), errors.Is(err, jetstream.ErrKeyExists):
		return 0, errConflict
	case err != nil:
		return 0, wrapBrokerErr(err)
	}
	st.remember(index, slotEntry{rec: rec, rev: newRev, delivered: delivered})
	return newRev, nil
}

// cached returns the record this client last wrote for a slot, when it can
// be trusted without a read: it freed the slot releasing this very message
// (seq) of the same life (epoch), and this delivery is the next one of that
// message, so nobody else had the token in between and the record cannot
// have changed. Anything else (another client held it since, a duplicate,
// another life) needs a fresh read.
func (st *slotStore) cached(index int, epoch, seq, delivered uint64) (slotEntry, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	c, ok := st.cache[index]
	return c, ok && c.rec.free() && c.rec.Epoch == epoch && c.rec.Seq == seq && c.delivered != 0 && c.delivered+1 == delivered
}

// remember keeps e as the latest record of a slot unless a newer revision
// is known.
func (st *slotStore) remember(index int, e slotEntry) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if c, ok := st.cache[index]; !ok || c.rev < e.rev {
		st.cache[index] = e
	}
}

// readAll reads every slot record (for a census).
func (st *slotStore) readAll(ctx context.Context) (map[int]slotEntry, error) {
	rctx, cancel := context.WithTimeout(ctx, st.timeout())
	defer cancel()
	prefix := st.lay.key(slotPrefix)
	w, err := st.kv.Watch(rctx, prefix+">", jetstream.IgnoreDeletes())
	if err != nil {
		return nil, wrapBrokerErr(err)
	}
	defer func() { _ = w.Stop() }()
	out := make(map[int]slotEntry)
	for {
		select {
		case <-rctx.Done():
			return nil, wrapBrokerErr(fmt.Errorf("reading slot records: %w", rctx.Err()))
		case e := <-w.Updates():
			if e == nil {
				return out, nil // initial values done
			}
			idx, ok := slotIndex(strings.TrimPrefix(e.Key(), prefix))
			if !ok {
				continue // no slot of any semaphore
			}
			rec, err := decodeRecord(e.Value())
			if err != nil {
				// Held by nobody we know, as read reads it: a census
				// sees the slot free (and says so), a delete closes it.
				rec = record{}
			}
			out[idx] = slotEntry{rec: rec, rev: e.Revision(), written: e.Created(), invalid: err != nil}
		}
	}
}

package natssem

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/backoff"
	"github.com/tokensem/tokensem/internal/ids"
	"github.com/tokensem/tokensem/internal/semopts"
	"github.com/tokensem/tokensem/internal/stored"
)

// The admin lock serializes the runs of reconcilers and Resize's change of
// the permit count, as amqpsem's lock does: without it a census could read
// the permit count before a concurrent Resize changed it and the tokens
// after, and remove a token of a slot that had just become valid (seen on
// a 3-node cluster with concurrent resizes and reconciles). Acquire and
// Release never take it.
//
// It is one KV record, lockKey, holding its holder's id, or nothing when
// free. A holder renews it every lockTTL/3; a record not renewed for
// lockTTL (defaultLockTTL; by the server's clock) belongs to a holder that
// died and may be taken over, so a crashed reconciler delays the next one
// by at most lockTTL.
//
// The lock fences what its holder does, as a permit's lease record does:
//   - the holder believes it holds the lock only until the send time of its
//     last write that landed plus lockTTL minus lockTTL/5 (held), by its own
//     clock, which a taker's lockTTL of silence by the server's clock cannot
//     beat; a holder whose process was stalled past that finds out at its
//     next step, whatever its renewal goroutine has noticed;
//   - what it writes to records is a compare-and-set on revisions it read,
//     which never repeat across lives of the semaphore (createResources), so
//     a write of a run whose lock was taken over fails once anything changed;
//     and the holding knows the life it was taken in (the configuration's
//     epoch, read while the lock was provably held): a configuration read
//     under it that names another life means the lock is gone with its life
//     (lockHold.readConfig), so no configuration write of a stale run can
//     land in the next life;
//   - what the broker cannot make conditional (removing the stream, the
//     bucket, a group key's records) comes right after a renewal written by
//     compare-and-set (confirm): a holder taken over stops there. Only a
//     process frozen for longer than lockTTL/5 between that renewal and the
//     removal it sends can still remove what it no longer owns.
const (
	lockKey        = "lock"
	defaultLockTTL = 15 * time.Second
)

type lockRecord struct {
	Holder string `json:"h,omitempty"` // empty: free
	Owner  string `json:"o,omitempty"` // holder's name, for whoever reads the bucket
}

// decodeLock parses a lock record. One that is not a record this package
// writes (too large, not JSON, a name longer than a holder's) is free: its
// writer cannot be renewing it.
func decodeLock(b []byte) lockRecord {
	var r lockRecord
	if stored.Decode(b, maxRecordSize, &r) != nil || len(r.Holder) > 64 || len(r.Owner) > semopts.MaxHolderName {
		return lockRecord{}
	}
	return r
}

// lockHold is one holding of the admin lock.
type lockHold struct {
	s    *Semaphore
	me   lockRecord
	val  []byte
	lost atomic.Bool // set when the renewal found the lock taken over

	// life is the epoch of the configuration when the lock was taken (0:
	// there was none): see readConfig.
	life uint64

	mu   sync.Mutex
	rev  uint64
	sent time.Time // send time of the last write of ours that landed
	stop chan struct{}
	done chan struct{}
	once sync.Once
}

func (s *Semaphore) takeLock(ctx context.Context) (*lockHold, error) {
	me := lockRecord{Holder: ids.New(), Owner: s.opts.HolderName}
	val, _ := json.Marshal(me)
	h := &lockHold{s: s, me: me, val: val, stop: make(chan struct{}), done: make(chan struct{})}
	pause := backoff.Backoff{Min: 20 * time.Millisecond, Max: 500 * time.Millisecond}
	seen := "" // the holder the last try that read the lock found
	// waited is the error of a wait that ends with err: it names the
	// holder a try found, even if the try the end cut short found none.
	waited := func(err error) error {
		if seen == "" {
			return err
		}
		return fmt.Errorf("natssem: waiting for the admin lock (held by %s): %w", seen, err)
	}
	for {
		sent := time.Now()
		rev, holder, err := h.try(ctx)
		if holder != "" {
			seen = holder
		}
		if cerr := ctx.Err(); cerr != nil && err != nil && seen != "" {
			return nil, waited(cerr)
		}
		if err == nil {
			h.rev, h.sent = rev, sent
			// The life the lock belongs to, read while it is provably ours
			// (held, after the read): no other life can begin then.
			cfg, _, cerr := s.readConfig(ctx)
			switch {
			case cerr == nil:
				h.life = cfg.Epoch
			case transient(cerr):
				err = cerr
			} // none, or unreadable: no life to hold the run to
			if err == nil {
				err = h.held()
			}
			if err == nil {
				go h.renew()
				return h, nil
			}
			h.free()
		}
		switch {
		case errors.Is(err, errConflict), errors.Is(err, errLockLost):
		case transient(err) && answered(err) && s.gone(ctx, time.Now().Add(s.requestTimeout())):
			// A bucket handle of a deleted semaphore answers "no responders".
			return nil, fmt.Errorf("%w: %s was deleted", tokensem.ErrNotInitialized, s.name)
		case transient(err):
			s.log.Warn("admin lock: the broker did not answer; retrying", "err", err)
		default:
			return nil, err
		}
		if err := pause.Wait(ctx, s.done); err != nil {
			return nil, waited(err)
		}
	}
}

// try takes the lock if it is free, its holder stopped renewing it, or it
// is ours already (an earlier try whose answer was lost landed), and
// returns the record's revision; errConflict, and the holder's name, if
// someone else holds it.
func (h *lockHold) try(ctx context.Context) (rev uint64, holder string, err error) {
	s := h.s
	if s.isClosed() {
		return 0, "", tokensem.ErrClosed
	}
	e, err := h.read(ctx)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
	case err != nil:
		return 0, "", wrapBrokerErr(err)
	default:
		cur := decodeLock(e.Value())
		switch {
		case cur.Holder == h.me.Holder:
			return e.Revision(), "", nil
		case cur.Holder != "":
			rctx, cancel := s.rtt(ctx)
			now, err := s.serverNow(rctx)
			cancel()
			if err != nil {
				return 0, "", err
			}
			if now.Sub(e.Created()) < s.lockTTL {
				return 0, cur.Owner, errConflict
			}
			s.log.Warn("admin lock: taking over from a holder that stopped renewing it", "owner", cur.Owner)
		}
		rev = e.Revision()
	}
	rev, err = h.cas(ctx, h.val, rev)
	return rev, "", err
}

func (h *lockHold) read(ctx context.Context) (jetstream.KeyValueEntry, error) {
	rctx, cancel := h.s.rtt(ctx)
	defer cancel()
	return h.s.kv.Get(rctx, h.s.lay.key(lockKey))
}

// cas writes val over revision rev. A write that loses to a record of
// ours (an earlier write of ours landed though its answer was lost) is
// resolved against it: a holding write is done already, at the record's
// revision; a freeing write is made again at that revision.
func (h *lockHold) cas(ctx context.Context, val []byte, rev uint64) (uint64, error) {
	for range 2 {
		rctx, cancel := h.s.rtt(ctx)
		newRev, err := h.s.kv.Update(rctx, h.s.lay.key(lockKey), val, rev)
		cancel()
		switch {
		case errors.Is(err, jetstream.ErrKeyRevisionMismatch), errors.Is(err, jetstream.ErrKeyExists):
			e, rerr := h.read(ctx)
			if rerr != nil {
				return 0, errConflict
			}
			cur := decodeLock(e.Value())
			if cur.Holder != h.me.Holder {
				return 0, errConflict
			}
			if bytes.Equal(val, h.val) {
				return e.Revision(), nil
			}
			rev = e.Revision()
		case err != nil:
			return 0, wrapBrokerErr(err)
		default:
			return newRev, nil
		}
	}
	return 0, errConflict
}

// renew rewrites the lock every lockTTL/3 until unlock; a renewal that
// finds the lock taken over marks the holding lost (see held).
func (h *lockHold) renew() {
	defer close(h.done)
	t := time.NewTicker(h.s.lockTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-t.C:
		}
		if errors.Is(h.write(context.Background()), errConflict) {
			h.s.log.Warn("admin lock: lost to another holder while held (not renewed for too long)")
			return
		}
	}
}

// write renews the lock by compare-and-set on our revision; on a conflict
// the holding is lost.
func (h *lockHold) write(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lost.Load() {
		return errConflict
	}
	sent := time.Now()
	newRev, err := h.cas(ctx, h.val, h.rev)
	switch {
	case err == nil:
		h.rev, h.sent = newRev, sent
	case errors.Is(err, errConflict):
		h.lost.Store(true)
	}
	return err
}

// lockMargin is how long before a taker could take the lock over its
// holder stops believing it holds it (see held).
func lockMargin(ttl time.Duration) time.Duration { return ttl / 5 }

// held returns an error if the holding was lost, or may have been: its
// last landed write is so old that another client may take the lock over
// soon (see the top of this file). A run must not change anything after
// that.
func (h *lockHold) held() error {
	h.mu.Lock()
	sent := h.sent
	h.mu.Unlock()
	switch ttl := h.s.lockTTL; {
	case h.lost.Load():
		return fmt.Errorf("%w: taken over (not renewed for %v); stopping", errLockLost, ttl)
	case time.Since(sent) > ttl-lockMargin(ttl):
		return fmt.Errorf("%w: not renewed for %v (another client may take it over after %v); stopping", errLockLost,
			time.Since(sent).Round(time.Millisecond), ttl)
	}
	return nil
}

// confirm renews the lock now and returns nil if it is still ours: call it
// right before a step the broker cannot make conditional (a removal).
func (h *lockHold) confirm(ctx context.Context) error {
	if err := h.held(); err != nil {
		return err
	}
	if err := h.write(ctx); err != nil {
		if errors.Is(err, errConflict) {
			return fmt.Errorf("%w: taken over (not renewed for %v); stopping", errLockLost, h.s.lockTTL)
		}
		return err
	}
	return h.held()
}

// abandon stops the renewal without freeing the lock: Delete calls it
// once the bucket, and the lock with it, is gone.
func (h *lockHold) abandon() {
	h.once.Do(func() {
		close(h.stop)
		<-h.done
	})
}

// unlock stops the renewal and frees the lock; on a conflict someone took
// it over already, and a failed write leaves it to expire.
func (h *lockHold) unlock() {
	h.once.Do(func() {
		close(h.stop)
		<-h.done
		h.free()
	})
}

// free writes the lock record free, unless the holding was lost.
func (h *lockHold) free() {
	if h.lost.Load() {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, err := h.cas(context.Background(), []byte("{}"), h.rev); err != nil && !errors.Is(err, errConflict) {
		h.s.log.Warn("admin lock: could not free it; it expires in "+h.s.lockTTL.String(), "err", err)
	}
}

// errLockLost says that the admin lock was lost while a run held it: the
// run stops, changing nothing more.
var errLockLost = errors.New("natssem: the admin lock was lost")

// readConfig reads the configuration under the lock (see the top of this
// file): one of another life than the lock's means the lock is gone with
// its life, and returns an error wrapping errLockLost.
func (h *lockHold) readConfig(ctx context.Context) (config, uint64, error) {
	cfg, rev, err := h.s.readConfig(ctx)
	if err := h.sameLife(cfg, err); err != nil {
		return config{}, 0, err
	}
	return cfg, rev, err
}

// sameLife returns an error wrapping errLockLost if cfg (read with error
// err) shows that the life the lock was taken in has ended.
func (h *lockHold) sameLife(cfg config, err error) error {
	switch {
	case h.life == 0:
		return nil
	case errors.Is(err, tokensem.ErrNotInitialized):
		return fmt.Errorf("%w: the semaphore was deleted", errLockLost)
	case err == nil && cfg.Epoch != h.life:
		return fmt.Errorf("%w: the semaphore was made again (epoch %d, the lock's %d)", errLockLost, cfg.Epoch, h.life)
	}
	return nil
}

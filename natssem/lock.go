package natssem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/backoff"
	"github.com/tokensem/tokensem/internal/ids"
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
// by at most lockTTL. Semaphores created by earlier versions get the record
// on first use; clients of earlier versions do not take it.
const (
	lockKey        = "lock"
	defaultLockTTL = 15 * time.Second
)

type lockRecord struct {
	Holder string `json:"h,omitempty"` // empty: free
	Owner  string `json:"o,omitempty"` // holder's name, for whoever reads the bucket
}

// lock takes the admin lock, waiting while another live holder has it,
// until ctx ends. unlock frees it (and stops its renewal).
func (s *Semaphore) lock(ctx context.Context) (unlock func(), err error) {
	me := lockRecord{Holder: ids.New(), Owner: s.opts.HolderName}
	val, _ := json.Marshal(me)
	pause := backoff.Backoff{Min: 20 * time.Millisecond, Max: 500 * time.Millisecond}
	for {
		rev, holder, err := s.tryLock(ctx, val)
		switch {
		case err == nil:
			return s.holdLock(val, rev), nil
		case errors.Is(err, errConflict):
		case transient(err):
			s.log.Warn("admin lock: the broker did not answer; retrying", "err", err)
		default:
			return nil, err
		}
		if err := pause.Wait(ctx, s.done); err != nil {
			if holder != "" {
				return nil, fmt.Errorf("natssem: waiting for the admin lock (held by %s): %w", holder, err)
			}
			return nil, err
		}
	}
}

// tryLock takes the lock if it is free or its holder stopped renewing it,
// and returns the record's revision; errConflict, and the holder's name,
// if someone holds it.
func (s *Semaphore) tryLock(ctx context.Context, val []byte) (rev uint64, holder string, err error) {
	if s.isClosed() {
		return 0, "", tokensem.ErrClosed
	}
	rctx, cancel := s.rtt(ctx)
	defer cancel()
	e, err := s.kv.Get(rctx, lockKey)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
	case err != nil:
		return 0, "", wrapBrokerErr(err)
	default:
		var cur lockRecord
		_ = json.Unmarshal(e.Value(), &cur) // an unreadable record is free
		if cur.Holder != "" {
			now, err := s.serverNow(rctx)
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
	rev, err = s.casLock(rctx, val, rev)
	return rev, "", err
}

func (s *Semaphore) casLock(ctx context.Context, val []byte, rev uint64) (uint64, error) {
	newRev, err := s.kv.Update(ctx, lockKey, val, rev)
	switch {
	case errors.Is(err, jetstream.ErrKeyRevisionMismatch), errors.Is(err, jetstream.ErrKeyExists):
		return 0, errConflict
	case err != nil:
		return 0, wrapBrokerErr(err)
	}
	return newRev, nil
}

// holdLock renews the lock at revision rev until the returned unlock frees
// it.
func (s *Semaphore) holdLock(val []byte, rev uint64) (unlock func()) {
	var (
		mu   sync.Mutex
		stop = make(chan struct{})
		done = make(chan struct{})
	)
	go func() {
		defer close(done)
		t := time.NewTicker(s.lockTTL / 3)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			mu.Lock()
			ctx, cancel := s.rtt(context.Background())
			newRev, err := s.casLock(ctx, val, rev)
			cancel()
			if err == nil {
				rev = newRev
			}
			mu.Unlock()
			if errors.Is(err, errConflict) {
				s.log.Warn("admin lock: lost to another holder while held (not renewed for too long)")
				return
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(stop)
			<-done
			mu.Lock()
			defer mu.Unlock()
			ctx, cancel := s.rtt(context.Background())
			defer cancel()
			// Free it; on a conflict someone took it over already. A failed
			// write leaves it to expire.
			if _, err := s.casLock(ctx, []byte("{}"), rev); err != nil && !errors.Is(err, errConflict) {
				s.log.Warn("admin lock: could not free it; it expires in "+s.lockTTL.String(), "err", err)
			}
		})
	}
}

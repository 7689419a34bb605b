package natssem

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem"
)

// List returns the semaphores of the NATS server or cluster nc is
// connected to, sorted by name: every KV bucket tokensem_NAME, with its
// configuration. A bucket without one (an Init that has not written it
// yet, or a Delete half done) is listed as "creating" with 0 permits.
//
// Errors: a wrapped broker error.
func List(ctx context.Context, nc *nats.Conn) ([]tokensem.Info, error) {
	s, err := newSemaphore(nc, "", mustOptions())
	if err != nil {
		return nil, err
	}
	var out []tokensem.Info
	err = s.retry(ctx, "list", func() error {
		out, err = s.list(ctx)
		return err
	})
	return out, err
}

func (s *Semaphore) list(ctx context.Context) ([]tokensem.Info, error) {
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	lister := s.js.KeyValueStoreNames(lctx)
	var names []string
	for b := range lister.Name() { // drained to the end: the lister's goroutine sends until then
		if name, ok := strings.CutPrefix(b, bucketPrefix); ok && tokensem.ValidateName(name) == nil {
			names = append(names, name)
		}
	}
	if err := lister.Error(); err != nil {
		return nil, wrapBrokerErr(fmt.Errorf("listing KV buckets: %w", err))
	}
	slices.Sort(names)
	out := make([]tokensem.Info, 0, len(names))
	for _, name := range names {
		info := tokensem.Info{Name: name, Backend: "nats", State: stateCreating}
		rctx, cancel := s.rtt(ctx)
		kv, err := s.js.KeyValue(rctx, BucketName(name))
		var e jetstream.KeyValueEntry
		if err == nil {
			e, err = kv.Get(rctx, configKey)
		}
		cancel()
		switch {
		case errors.Is(err, jetstream.ErrBucketNotFound):
			continue // deleted meanwhile
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return nil, wrapBrokerErr(err)
		default:
			cfg, err := decodeConfig(e.Value())
			if err != nil {
				return nil, err
			}
			info.Permits, info.Lease = cfg.Permits, cfg.Lease
			if cfg.State == stateReady {
				info.State = stateReady
			}
		}
		out = append(out, info)
	}
	return out, nil
}

// stateCreating is what List reports of a semaphore that is not ready.
const stateCreating = "creating"

// Delete removes semaphore name: its KV bucket (configuration and slot
// records) first, so that nobody can open it any more, then its token
// stream. While any permit is held it returns an error wrapping
// tokensem.ErrHeld, naming the held slots, and changes nothing. A permit
// taken while Delete runs is lost as with ForceDelete. Delete finishes a
// delete that was cut short; afterwards Init of the same name with other
// values succeeds.
//
// Errors: tokensem.ErrInvalidName, tokensem.ErrNotInitialized (nothing of
// that name exists), tokensem.ErrHeld, or a wrapped broker error.
func Delete(ctx context.Context, nc *nats.Conn, name string) error {
	return deleteSemaphore(ctx, nc, name, false)
}

// ForceDelete removes semaphore name as Delete does, held permits or not.
// Every holder learns of it at its next renewal (Done closes with an error
// wrapping tokensem.ErrLeaseLost), within a third of the lease; waiters in
// Acquire return tokensem.ErrNotInitialized.
func ForceDelete(ctx context.Context, nc *nats.Conn, name string) error {
	return deleteSemaphore(ctx, nc, name, true)
}

func deleteSemaphore(ctx context.Context, nc *nats.Conn, name string, force bool) error {
	if err := tokensem.ValidateName(name); err != nil {
		return err
	}
	s, err := newSemaphore(nc, name, mustOptions())
	if err != nil {
		return err
	}
	// A try whose delete landed unanswered leaves nothing for the next
	// one to find: that is success, not ErrNotInitialized.
	removed := false
	err = s.retry(ctx, "delete", func() error { return s.delete(ctx, force, &removed) })
	if removed && errors.Is(err, tokensem.ErrNotInitialized) {
		return nil
	}
	return err
}

func (s *Semaphore) delete(ctx context.Context, force bool, removed *bool) error {
	rctx, cancel := s.rtt(ctx)
	kv, err := s.js.KeyValue(rctx, BucketName(s.name))
	cancel()
	switch {
	case errors.Is(err, jetstream.ErrBucketNotFound):
		// Nothing to check; a stream left by a delete cut short goes too.
		return s.deleteStream(ctx, true)
	case err != nil:
		return wrapBrokerErr(err)
	}
	s.setBucket(kv)
	if !force {
		if err := s.refuseHeld(ctx); err != nil {
			return err
		}
	}
	*removed = true // from here on, what a later try does not find is gone
	rctx, cancel = s.rtt(ctx)
	err = s.js.DeleteKeyValue(rctx, BucketName(s.name))
	cancel()
	if err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
		return wrapBrokerErr(err)
	}
	return s.deleteStream(ctx, false)
}

// deleteStream deletes the token stream; a missing one is
// ErrNotInitialized when nothing else was found either.
func (s *Semaphore) deleteStream(ctx context.Context, onlyThis bool) error {
	rctx, cancel := s.rtt(ctx)
	defer cancel()
	err := s.js.DeleteStream(rctx, StreamName(s.name))
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		if onlyThis {
			return fmt.Errorf("%w: %s", tokensem.ErrNotInitialized, s.name)
		}
		return nil
	case err != nil:
		return wrapBrokerErr(err)
	}
	if !onlyThis {
		s.log.Info("semaphore deleted")
	}
	return nil
}

// refuseHeld returns an error wrapping tokensem.ErrHeld if a live holder
// holds any slot.
func (s *Semaphore) refuseHeld(ctx context.Context) error {
	cfg, _, err := s.readConfig(ctx)
	if errors.Is(err, tokensem.ErrNotInitialized) {
		return nil // a creation that never wrote its configuration: nobody holds anything
	}
	if err != nil {
		return err
	}
	slots, err := s.slots.readAll(ctx)
	if err != nil {
		return err
	}
	now, err := s.serverNow(ctx)
	if errors.Is(err, tokensem.ErrNotInitialized) {
		return nil // no consumer: nobody can hold a token
	}
	if err != nil {
		return err
	}
	var held []int
	for idx, sl := range slots {
		if sl.live(now, cfg.Lease) {
			held = append(held, idx)
		}
	}
	if len(held) > 0 {
		slices.Sort(held)
		return fmt.Errorf("%w: %s: slots %v are held (renewed within the last %v)", tokensem.ErrHeld, s.name, held, cfg.Lease)
	}
	return nil
}

// errDeleted is the cause of the loss of a permit whose semaphore was
// deleted.
var errDeleted = errors.New("natssem: the semaphore was deleted")

// gone reports whether the semaphore's bucket no longer exists (it was
// deleted), as opposed to not answering. It asks by deadline at the
// latest: a holder must give its permit up at its deadline whatever gone
// learns.
func (s *Semaphore) gone(ctx context.Context, deadline time.Time) bool {
	rctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	rctx, cancel = context.WithTimeout(rctx, s.opts.RequestTimeout)
	defer cancel()
	_, err := s.js.KeyValue(rctx, BucketName(s.name))
	return errors.Is(err, jetstream.ErrBucketNotFound)
}

// answered reports whether a failed request got an answer (a missing
// stream answers "no responders" at once), rather than timing out: only
// then is it worth asking whether the semaphore is gone.
func answered(err error) bool {
	return !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout) &&
		!errors.Is(err, context.Canceled)
}

// mustOptions returns the default options.
func mustOptions() options {
	o, err := newOptions(nil)
	if err != nil {
		panic(err) // the defaults are valid
	}
	return o
}

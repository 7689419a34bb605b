package natssem

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem"
)

// List returns the semaphores of the NATS server or cluster nc is
// connected to, sorted by name: every KV bucket tokensem_NAME, with its
// configuration. A bucket without one (an Init that has not written it
// yet, or a Delete half done) is listed as "creating" with 0 permits, and
// one whose configuration is invalid as "invalid", with the reason in
// Warning (see tokensem.ErrInvalidRecord).
// With WithGroup it lists the keys of that group instead (none if the
// group does not exist); other options are ignored.
//
// Errors: tokensem.ErrInvalidOption, or a wrapped broker error.
func List(ctx context.Context, nc *nats.Conn, opts ...Option) ([]tokensem.Info, error) {
	o, err := newOptions(opts)
	if err != nil {
		return nil, err
	}
	s, err := newSemaphore(nc, "", o)
	if err != nil {
		return nil, err
	}
	var out []tokensem.Info
	err = s.retry(ctx, "list", func() error {
		if s.lay.grouped() {
			out, err = s.listGroup(ctx)
		} else {
			out, err = s.list(ctx)
		}
		return err
	})
	return out, err
}

// listGroup lists the keys of a group: every configuration record in its
// bucket, read with one watch.
func (s *Semaphore) listGroup(ctx context.Context) ([]tokensem.Info, error) {
	rctx, cancel := s.rtt(ctx)
	defer cancel()
	kv, err := s.js.KeyValue(rctx, s.lay.bucket)
	switch {
	case errors.Is(err, jetstream.ErrBucketNotFound):
		return nil, nil
	case err != nil:
		return nil, wrapBrokerErr(err)
	}
	// The watch runs under a guard: a refused subject ends it at once.
	gctx, stop := s.rights.guard(ctx, s, 0)
	defer stop()
	w, err := kv.Watch(gctx, "*."+configKey, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, wrapBrokerErr(err)
	}
	defer func() { _ = w.Stop() }()
	var out []tokensem.Info
	for {
		var e jetstream.KeyValueEntry
		select {
		case <-gctx.Done():
			return nil, wrapBrokerErr(fmt.Errorf("listing group %s: %w", s.lay.group, gctx.Err()))
		case e = <-w.Updates():
		}
		if e == nil {
			break // initial values done
		}
		name, _ := strings.CutSuffix(e.Key(), "."+configKey)
		if tokensem.ValidateName(name) != nil {
			continue
		}
		out = append(out, describe(name, e.Value()))
	}
	slices.SortFunc(out, func(a, b tokensem.Info) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

func (s *Semaphore) list(ctx context.Context) ([]tokensem.Info, error) {
	// Guarded: a refusal ends the lister's requests (their contexts are
	// derived from lctx) at once; retry then reports it.
	lctx, cancel := s.rights.guard(ctx, s, 0)
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
		kv, err := s.js.KeyValue(rctx, ResourcesOf(name, "").Bucket)
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
			info = describe(name, e.Value())
		}
		out = append(out, info)
	}
	return out, nil
}

// describe lists semaphore name by its stored configuration b. One that
// is invalid is listed as such (tokensem.Info.Warning says why), not
// read: it fails that semaphore, not the list.
func describe(name string, b []byte) tokensem.Info {
	info := tokensem.Info{Name: name, Backend: "nats", State: stateCreating}
	cfg, err := decodeConfig(b)
	if err != nil {
		info.State, info.Warning = stateInvalid, err.Error()
		return info
	}
	info.Permits, info.Lease = cfg.Permits, cfg.Lease
	if cfg.State == stateReady || cfg.State == stateDeleting {
		info.State = cfg.State
	}
	return info
}

// stateCreating is what List reports of a semaphore that is not ready,
// stateInvalid of one whose configuration cannot be read.
const (
	stateCreating = "creating"
	stateInvalid  = "invalid"
)

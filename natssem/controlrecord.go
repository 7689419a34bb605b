package natssem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/adaptive"
	"github.com/tokensem/tokensem/internal/stored"
)

// controllerKey is the KV key of the controller's record (see
// RecordController), beside the configuration; Delete purges it with the
// semaphore's other keys.
const controllerKey = "controller"

// controllerEntry is the stored form of a controller record: the record,
// and the life (epoch) of the semaphore it was written in, so that a
// record a controller of an earlier life wrote late is not shown as this
// life's.
type controllerEntry struct {
	Epoch  uint64          `json:"epoch"`
	Record json.RawMessage `json:"record"`
}

// RecordController stores r, the record of the controller that leads this
// semaphore's count (package adaptive, seminit adapt), beside its
// configuration, in place of the last one; ControllerRecord reads it back
// and seminit status shows it. It is informational: nothing admits or
// resizes by it. Writing it takes the rights to write the configuration
// (an admin's, see docs/permissions-nats.md).
//
// Errors: tokensem.ErrInvalidOption (r fails adaptive.Record.Check),
// tokensem.ErrClosed, tokensem.ErrPermissionDenied, or a wrapped broker
// error.
func (s *Semaphore) RecordController(ctx context.Context, r adaptive.Record) error {
	b, err := adaptive.EncodeRecord(r)
	if err != nil {
		return err
	}
	if s.isClosed() {
		return tokensem.ErrClosed
	}
	// Not into a semaphore deleted meanwhile (a key of a group would
	// leave the record in the group's bucket), nor into a later life.
	cfg, _, err := s.readConfig(ctx)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound): // the bucket went with a lone semaphore
		return fmt.Errorf("%w: %s was deleted", tokensem.ErrNotInitialized, s.name)
	case err != nil:
		return err
	case cfg.State == stateDeleting || cfg.Epoch != s.config().Epoch:
		return fmt.Errorf("%w: %s was deleted", tokensem.ErrNotInitialized, s.name)
	}
	entry, err := stored.Encode(controllerEntry{Epoch: cfg.Epoch, Record: b}) // the record as EncodeRecord wrote it
	if err != nil {
		return fmt.Errorf("natssem: %w", err)
	}
	rctx, cancel := s.rtt(ctx)
	defer cancel()
	if _, err := s.kv.Put(rctx, s.lay.key(controllerKey), entry); err != nil {
		return wrapBrokerErr(err)
	}
	return nil
}

// ControllerRecord returns the record the semaphore's controller stored
// last (see RecordController); ok is false when none has in this life of
// the semaphore.
//
// Errors: tokensem.ErrInvalidRecord (a record RecordController would not
// have written), tokensem.ErrClosed, or a wrapped broker error.
func (s *Semaphore) ControllerRecord(ctx context.Context) (r adaptive.Record, ok bool, err error) {
	if s.isClosed() {
		return r, false, tokensem.ErrClosed
	}
	data, _, err := s.readLast(ctx, s.lay.key(controllerKey))
	switch {
	case errors.Is(err, errNoRecord):
		return r, false, nil
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return r, false, fmt.Errorf("%w: %s was deleted", tokensem.ErrNotInitialized, s.name)
	case err != nil:
		return r, false, wrapBrokerErr(fmt.Errorf("reading the controller record of %s: %w", s.name, err))
	}
	var e controllerEntry
	if err := stored.Decode(data, adaptive.MaxRecordLen+64, &e); err != nil {
		return r, false, fmt.Errorf("natssem: the controller record of %s: %w", s.name, err)
	}
	if e.Epoch != s.config().Epoch {
		return r, false, nil // an earlier life's
	}
	if r, err = adaptive.DecodeRecord(e.Record); err != nil {
		return r, false, fmt.Errorf("natssem: the controller record of %s: %w", s.name, err)
	}
	return r, true, nil
}

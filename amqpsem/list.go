package amqpsem

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/driver"
	"github.com/tokensem/tokensem/internal/ids"
	"github.com/tokensem/tokensem/internal/stored"
)

// The registry is how List finds semaphores: AMQP cannot list queues. It
// is the durable quorum queue registryQueue holding one persistent message
// per creation of a semaphore ({"name": ...}).
//
//   - Init registers a semaphore when it creates it, before its
//     configuration exists, so every semaphore made by this version has an
//     entry; a creation started over registers again (List and Delete
//     handle copies).
//   - List and Delete read the registry only under its lock, the
//     exclusive queue registryLock: each takes every entry (unacked), and
//     closing its channel puts back those it did not acknowledge. A
//     reader waits until an earlier reader's entries are back (see
//     readRegistry), so none misses an entry another held, and a publish
//     by a concurrent Init only adds one.
//   - The entries are a hint; the semaphore's queues are the truth. List
//     reads each listed semaphore's configuration, and removes the entries
//     of a name with no configuration queue once they are older than
//     staleEntry (younger ones may belong to an Init still creating it), and
//     all but one copy of each name, and at once every entry no Init
//     writes (over maxEntrySize, not JSON, or no valid name). A semaphore
//     whose configuration is invalid is listed as "invalid", not read, and
//     one whose configuration cannot be read in time as "unreadable".
//     Delete removes its name's entries after
//     the queues; a Delete that dies in between leaves entries List removes
//     later.
//
// The age of an entry is read from its publisher's clock: clients whose
// clocks are more than staleEntry apart could drop the entry of an Init
// still in progress. A reader reads until the queue holds no entry it has
// not delivered to it (see readRegistry), waiting up to registryReadMax
// for an earlier reader's entries to be back.

// Registry queue names. A semaphore name cannot be empty, so these never
// collide with a semaphore's queues (tokensem.NAME...).
const (
	registryQueue    = "tokensem..registry"
	registryLock     = "tokensem..registry.lock"
	registryExchange = "tokensem..registry.x"
	staleEntry       = 5 * time.Minute
)

type registryEntry struct {
	Name string `json:"name"`
}

// register adds an entry for the semaphore to the registry, through the
// registry's exchange: a user allowed to register (write on that exchange)
// may not read, empty or lock the registry (see List). A registry that is
// not set up yet (or lost its exchange or binding) is set up first, if the
// user may (see setupRegistry).
func (s *Semaphore) register(ctx context.Context) error {
	if driver.IsGate(s.name) {
		return nil // found through its semaphore, never listed
	}
	err := s.publishEntry(ctx)
	if !errors.Is(err, errNoRegistry) {
		return err
	}
	if err := s.setupRegistry(ctx); err != nil {
		return err
	}
	return s.publishEntry(ctx)
}

// errNoRegistry says that a registry entry reached no queue: the
// registry's exchange or its binding is missing.
var errNoRegistry = errors.New("amqpsem: the registry is not set up")

// publishEntry publishes the semaphore's registry entry, with a publisher
// confirm; errNoRegistry when the entry reached no registry queue.
func (s *Semaphore) publishEntry(ctx context.Context) error {
	body, _ := json.Marshal(registryEntry{Name: s.name})
	return s.publishRegistry(ctx, "register "+s.name, body)
}

// publishRegistry publishes body into the registry queue through the
// registry's exchange, with a publisher confirm, on a channel of its own
// (a refusal closes it); errNoRegistry when it reached no registry queue.
func (s *Semaphore) publishRegistry(ctx context.Context, what string, body []byte) error {
	ch, _, err := s.c.channel(ctx)
	if err != nil {
		return err
	}
	defer ch.Close()
	rctx, cancel := s.rtt(ctx)
	defer cancel()
	var dc *amqp.DeferredConfirmation
	// A mandatory publish that no binding routes comes back (basic.return)
	// before its confirm: amqp091 hands a channel's frames on in order.
	returns := ch.NotifyReturn(make(chan amqp.Return, 1))
	err = s.c.rpc(rctx, ch, func() (err error) {
		if err := ch.Confirm(false); err != nil {
			return err
		}
		dc, err = ch.PublishWithDeferredConfirmWithContext(rctx, registryExchange, registryQueue, true, false, amqp.Publishing{
			DeliveryMode: amqp.Persistent, ContentType: "application/json", Timestamp: time.Now(), Body: body,
		})
		return err
	}, nil)
	if err == nil {
		err = s.c.waitConfirms(rctx, ch, []*amqp.DeferredConfirmation{dc})
	}
	switch r := ch.closeReason(); {
	case r != nil && r.Code == amqp.NotFound: // no exchange
		return errNoRegistry
	case err != nil:
		return wrapBrokerErr(what, err)
	}
	select {
	case _, ok := <-returns:
		if ok {
			return errNoRegistry // no binding
		}
	default:
	}
	return nil
}

// setupRegistry declares the registry queue and exchange and binds them:
// List does it (an operator's rights, see docs/permissions-rabbitmq.md),
// and Init when no List ran before.
func (s *Semaphore) setupRegistry(ctx context.Context) error {
	ch, sess, err := s.c.channel(ctx)
	if err != nil {
		return err
	}
	defer ch.Close()
	rctx, cancel := s.rtt(ctx)
	defer cancel()
	err = s.c.rpc(rctx, ch, func() error {
		// Entries are requeued by every List: on 4.x the delivery limit
		// must be off, as for the configuration queue.
		if _, err := ch.QueueDeclare(registryQueue, true, false, false, false, tokenQueueArgs(Quorum, sess.version)); err != nil {
			return err
		}
		if err := ch.ExchangeDeclare(registryExchange, amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
			return err
		}
		return ch.QueueBind(registryQueue, registryQueue, registryExchange, false, nil)
	}, nil)
	if denied(err) {
		return fmt.Errorf("amqpsem: the registry (queue %s, exchange %s) is not set up, and this user may not set it up: "+
			"a List by a user with the operator's permissions does: %w", registryQueue, registryExchange, err)
	}
	return wrapBrokerErr("set up the registry", err)
}

// List returns the semaphores in the registry of the broker c is
// connected to, sorted by name (see docs/protocol-rabbitmq.md). A semaphore whose
// creation has not finished is listed as "creating", one whose
// configuration is invalid as "invalid", with the reason in Warning (see
// tokensem.ErrInvalidRecord), and one whose configuration could not be
// read in time, or whose read failed at the broker, as "unreadable", with
// the error in Warning.
//
// List publishes one message, the end marker of its read of the registry
// (see readRegistry). During a resource alarm RabbitMQ blocks a
// connection that publishes until the alarm clears, as it does for Init:
// a List then fails, and so does other work on c that needs an answer
// from the broker; give operators' Lists a Conn of their own.
//
// Errors: a wrapped broker error.
func List(ctx context.Context, c *Conn) ([]tokensem.Info, error) {
	s, err := newSemaphore(c, "", c.logTo())
	if err != nil {
		return nil, err
	}
	defer s.Close()
	var out []tokensem.Info
	err = s.retryLocking(ctx, "list", func() error {
		out, err = s.list(ctx)
		return err
	})
	return out, err
}

func (s *Semaphore) list(ctx context.Context) ([]tokensem.Info, error) {
	// Set up here, by the operator, the registry lets Init register with
	// no right to read, empty or lock it (see register). A user who may
	// not set it up lists it as it is.
	if err := s.setupRegistry(ctx); err != nil && !denied(err) {
		return nil, err
	}
	var out []tokensem.Info
	err := s.withRegistry(ctx, true, func(entries []registered) ([]registered, error) {
		var drop, first []registered
		seen := map[string]bool{}
		for _, e := range entries {
			if e.junk || seen[e.Name] {
				drop = append(drop, e) // junk, or a copy
				continue
			}
			seen[e.Name] = true
			first = append(first, e)
		}
		// Each description is a few round trips: up to listParallel at once.
		infos := make([]tokensem.Info, len(first))
		errs := make([]error, len(first))
		var wg sync.WaitGroup
		slots := make(chan struct{}, listParallel)
		for i, e := range first {
			slots <- struct{}{}
			wg.Go(func() {
				defer func() { <-slots }()
				infos[i], errs[i] = s.describeBounded(ctx, e.Name)
			})
		}
		wg.Wait()
		for i, e := range first {
			switch err := errs[i]; {
			case errors.Is(err, tokensem.ErrNotInitialized):
				if time.Since(e.at) > staleEntry {
					drop = append(drop, e)
				}
			case err != nil:
				return nil, err
			default:
				out = append(out, infos[i])
			}
		}
		return drop, nil
	})
	slices.SortFunc(out, func(a, b tokensem.Info) int { return strings.Compare(a.Name, b.Name) })
	return out, err
}

// describeBounded is describe within the time one configuration read may
// take (configRetry, and a request timeout more): a semaphore whose
// configuration cannot be read in it, or whose read fails at the broker,
// is listed as "unreadable" with the reason in Warning, and does not fail
// the list (an uncapped configuration queue holding a huge message took
// each read a minute, and the list with it). The end of the caller's ctx,
// a permission refusal, and a closed Conn still fail the list.
func (s *Semaphore) describeBounded(ctx context.Context, name string) (tokensem.Info, error) {
	dctx, cancel := context.WithTimeout(ctx, s.configRetry()+s.opts.RequestTimeout)
	defer cancel()
	info, err := s.describe(dctx, name)
	switch {
	case err == nil, ctx.Err() != nil, errors.Is(err, tokensem.ErrNotInitialized),
		errors.Is(err, tokensem.ErrPermissionDenied), errors.Is(err, tokensem.ErrClosed):
		return info, err
	case errors.Is(err, tokensem.ErrUnavailable), errors.Is(err, errAborted), errors.Is(err, context.DeadlineExceeded):
		return tokensem.Info{Name: name, Backend: "amqp", State: "unreadable",
			Warning: "its configuration could not be read: " + err.Error()}, nil
	}
	return info, err
}

// describe reads semaphore name's configuration for List.
func (s *Semaphore) describe(ctx context.Context, name string) (tokensem.Info, error) {
	if tokensem.ValidateName(name) != nil {
		return tokensem.Info{}, fmt.Errorf("%w: %q", tokensem.ErrNotInitialized, name) // junk: dropped when old
	}
	sem, err := newSemaphore(s.c, name, nil)
	if err != nil {
		return tokensem.Info{}, err
	}
	defer sem.Close()
	info := tokensem.Info{Name: name, Backend: "amqp", State: "creating"}
	cfg, err := sem.loadConfig(ctx)
	switch {
	case errors.Is(err, tokensem.ErrInvalidRecord):
		// Listed as such, not read: it fails that semaphore, not the list.
		info.State, info.Warning = "invalid", err.Error()
		return info, nil
	case errors.Is(err, tokensem.ErrNotInitialized):
		// A token queue without a configuration: a creation or a delete
		// cut short, still there to be finished.
		if exists, qerr := sem.queueExists(ctx, tokenQueue(name)); qerr != nil || exists {
			return info, qerr
		}
		return info, err
	case err != nil:
		return info, err
	}
	info.Permits = cfg.Permits
	switch {
	case cfg.ready():
		info.State = "ready"
	case cfg.State == stateDeleting:
		info.State = "deleting"
	}
	return info, nil
}

// unregister removes every registry entry of the semaphore, if it can:
// an admin of one semaphore may not read the registry (see
// docs/permissions-rabbitmq.md), and a registry locked by someone else
// (an operator's List, or a user who holds its lock) is waited for at most
// the request timeout. The entries left are List's to drop (it drops
// those of names with no semaphore once they are older than staleEntry),
// so neither fails the delete.
func (s *Semaphore) unregister(ctx context.Context) {
	if driver.IsGate(s.name) {
		return
	}
	uctx, cancel := context.WithTimeout(ctx, s.opts.RequestTimeout)
	defer cancel()
	if err := s.removeEntries(uctx); err != nil && ctx.Err() == nil {
		s.log.Info("deleted; its registry entries are left for the next List to drop", "reason", err)
	}
}

// removeEntries removes every registry entry of the semaphore.
func (s *Semaphore) removeEntries(ctx context.Context) error {
	// Not exact: an entry missed is left for List to drop, and the
	// marker's publish would make Delete wait out a resource alarm.
	return s.withRegistry(ctx, false, func(entries []registered) ([]registered, error) {
		var drop []registered
		for _, e := range entries {
			if e.Name == s.name {
				drop = append(drop, e)
			}
		}
		return drop, nil
	})
}

// registered is one registry entry as read.
type registered struct {
	registryEntry
	junk bool // not an entry any Init writes: List drops it
	tag  uint64
	at   time.Time
}

// maxEntrySize caps a registry entry: {"name": ...} with a name of at most
// tokensem.MaxNameLen bytes.
const maxEntrySize = 256

// decodeEntry parses a registry entry; ok is false for junk: too large,
// not JSON, or not naming a valid semaphore name.
func decodeEntry(b []byte) (e registryEntry, ok bool) {
	if stored.Decode(b, maxEntrySize, &e) != nil || tokensem.ValidateName(e.Name) != nil {
		return registryEntry{}, false
	}
	return e, true
}

// withRegistry takes the registry lock, takes every entry, hands them to
// fn, acknowledges (removes) the entries fn returns and puts the others
// back. A registry that does not exist is empty. exact asks for a read
// that ends on its own marker (see readRegistry).
func (s *Semaphore) withRegistry(ctx context.Context, exact bool, fn func([]registered) (drop []registered, err error)) error {
	ctx, unlock, err := s.takeLock(ctx, registryLock, "another List or Delete (the registry lock)")
	if err != nil {
		return err
	}
	defer unlock()
	exists, err := s.queueExists(ctx, registryQueue)
	if err != nil || !exists {
		if err == nil {
			_, err = fn(nil)
		}
		return err
	}
	ch, _, err := s.c.channel(ctx)
	if err != nil {
		return err
	}
	defer ch.Close() // puts back every entry not acknowledged
	rctx, cancel := s.rtt(ctx)
	var deliveries <-chan amqp.Delivery
	err = s.c.rpc(rctx, ch, func() error {
		// Every entry stays unacked until the read ends, so the prefetch
		// must cover them all: without one, a quorum queue hands a
		// consumer at most 2,000 (measured on 3.10.8: List missed the
		// newest entries of a registry of 3,165, and every Delete waited
		// registryReadMax for them). AMQP 0-9-1 caps it at 65,535.
		if err := ch.Qos(math.MaxUint16, 0, false); err != nil {
			return err
		}
		if err := rctx.Err(); err != nil {
			return err // abandoned: the registry's lock is no longer held
		}
		var err error
		deliveries, err = ch.Consume(registryQueue, registryReader, false, false, false, false, nil)
		return err
	}, nil)
	cancel()
	if err != nil {
		return wrapBrokerErr("read the registry", err)
	}
	entries, err := s.readRegistry(ctx, ch, deliveries, exact)
	if err != nil {
		return err
	}
	drop, err := fn(entries)
	if err != nil {
		return err
	}
	if err := s.ackEntries(ctx, ch, drop); err != nil {
		return wrapBrokerErr("update the registry", err)
	}
	return nil // closing the channel puts the other entries back
}

// ackBatch is how many acks ackEntries sends before it waits for the
// queue to apply them.
const ackBatch = 16

// ackEntries acknowledges (removes) the entries drop, ackBatch at a time.
//
// RabbitMQ 3.10's quorum-queue client in the channel sends at most 32
// commands before the queue has applied them (quorum_commands_soft_limit)
// and keeps the settlements beyond that to send later, when the queue
// answers; a channel closed meanwhile drops them, and the queue puts those
// entries back (rabbitmq-server issue 10327, open): a List that dropped 300
// junk entries left up to 254 of them. A basic.get after each batch is
// answered once the queue has applied everything sent before it, so no
// settlement waits when the channel closes. An entry the get takes is put
// back by the close. A get on a quorum queue electing a leader is answered
// by closing the connection (541): only a List of many junk entries gets
// there (List runs on an operator's Conn), never a Delete, which drops an
// entry or two.
func (s *Semaphore) ackEntries(ctx context.Context, ch *channel, drop []registered) error {
	for i, e := range drop {
		if i > 0 && i%ackBatch == 0 {
			rctx, cancel := s.rtt(ctx)
			err := s.c.rpc(rctx, ch, func() error {
				_, _, err := ch.Get(registryQueue, false)
				return err
			}, nil)
			cancel()
			if err != nil {
				return err
			}
		}
		if err := ch.Ack(e.tag, false); err != nil {
			return err
		}
	}
	return nil
}

// registryReader is the consumer tag of a registry read.
const registryReader = "tokensem-registry-reader"

// readRegistry reads the registry's entries from deliveries, the
// registry's consumer on ch, until it has every entry that was there
// when the read began.
//
// A reader puts back the entries it keeps by closing its channel (or by
// dying), and the queue takes them back a moment later, maybe after the
// registry's lock is free; a count of the ready entries taken before then
// is short (the next reader then missed a semaphore whose Init had
// returned before the List began), and so is one the broker could not
// take in time (RabbitMQ answers it with 0 ready, 0 consumers). So the
// read first waits until the queue says it has no entry ready and no
// consumer but this one: the count includes cancelled consumers still
// holding entries, and a quorum queue drops a consumer whose channel
// closed and hands its entries on in one step, so every earlier reader's
// entries are back and handed to this reader.
//
// Handed is not received: a delivery can still be on its way (a loaded
// machine held one past 250 ms of silence), and one on its way at the
// consumer's cancel goes back to the queue (3.10.8's rabbit_fifo_client
// returns what comes for a cancelled consumer). So an exact read then
// publishes a marker and reads until the marker comes back, behind every
// entry handed before it. The marker is junk to every other reader (the
// next List drops one a dead reader left). A read that is not exact, or
// that may not publish to the registry's exchange (an operator without
// write on it), ends after registryQuiet with nothing coming instead, and
// can miss an entry on its way, which the next read gets; a List says so
// in a warning. A concurrent Init's entry may or may not be read. A
// consumer the queue still counts after registryReadMax (a reader outside
// the lock, or one on a node cut off from the queue's) is read around,
// with a warning, and no marker: the queue could hand the marker to that
// consumer. After a leader change the count may come from a follower that
// lags, and the read may miss an entry without a warning; the next read
// gets it.
func (s *Semaphore) readRegistry(ctx context.Context, ch *channel, deliveries <-chan amqp.Delivery, exact bool) ([]registered, error) {
	var entries []registered
	add := func(d amqp.Delivery) {
		e, ok := decodeEntry(d.Body)
		entries = append(entries, registered{registryEntry: e, junk: !ok, tag: d.DeliveryTag, at: d.Timestamp})
	}
	marker, _ := json.Marshal(registryMarker{Marker: ids.New()})
	wait := time.NewTimer(registryPoll)
	defer wait.Stop()
	giveUp := time.Now().Add(registryReadMax)
	const (
		counting = iota // until the queue says every entry is handed here
		marked          // until the marker comes
		quiet           // without a marker: until nothing came for registryQuiet
	)
	phase := counting
read:
	for {
		select {
		case d, ok := <-deliveries:
			switch {
			case !ok:
				return nil, wrapBrokerErr("read the registry", errors.New("consumer cancelled"))
			case phase == marked && bytes.Equal(d.Body, marker):
				if err := ch.Ack(d.DeliveryTag, false); err != nil {
					return nil, wrapBrokerErr("read the registry", err)
				}
				// Every entry handed before the marker is in, so the
				// consumer is not cancelled: RabbitMQ 3.10 keeps what a
				// cancelled consumer holds when its node is lost until
				// the queue's leader changes (see loadConfigOnce), and the
				// entries stay held until fn is done and the channel
				// closes.
				return entries, nil
			}
			add(d)
			if phase != marked {
				phase = counting
				wait.Reset(registryPoll)
			}
		case <-wait.C:
			switch phase {
			case marked:
				s.log.Warn("the registry read's end marker did not come back; listing the entries read",
					"read", len(entries), "waited", registryReadMax)
				break read
			case quiet:
				break read
			}
			q, _, err := s.queueInfo(ctx, registryQueue)
			switch {
			case ctx.Err() != nil:
				return nil, ctx.Err()
			case err == nil && askerAlone(q):
			case time.Now().After(giveUp):
				s.log.Warn("registry entries are held by another reader or not delivered; listing those read",
					"read", len(entries), "ready", q.Messages, "readers", q.Consumers, "error", err)
				break read
			default:
				wait.Reset(registryPoll)
				continue
			}
			if !exact {
				phase = quiet
				wait.Reset(registryQuiet)
				continue
			}
			// The marker is behind every entry handed to this reader: the
			// queue gives a consumer's deliveries rising message ids, and
			// the client hands them on in id order (it fetches a missing
			// one before a later one).
			err = s.publishRegistry(ctx, "mark the end of the registry read", marker)
			switch {
			case err == nil:
				phase = marked
				wait.Reset(registryReadMax)
				continue
			case ctx.Err() != nil:
				return nil, ctx.Err()
			}
			msg := "the registry read could not publish its end marker, so it may miss an entry still on its way"
			if denied(err) {
				msg += " (grant write on the exchange " + registryExchange + ", see docs/permissions-rabbitmq.md)"
			}
			s.log.Warn(msg, "error", err)
			exact = false // once
			phase = quiet
			wait.Reset(registryQuiet)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	// Without the marker, the cancel brings in what is on its way. The
	// entries then stay held by a cancelled consumer until the channel
	// closes: lost with its node at that moment, they stay out of sight
	// until the registry's leader changes, and later reads warn that a
	// consumer holds them.
	rctx, cancel := s.rtt(ctx)
	defer cancel()
	if err := s.c.rpc(rctx, ch, func() error { return ch.Cancel(registryReader, false) }, nil); err != nil {
		return nil, wrapBrokerErr("read the registry", err)
	}
	for d := range deliveries { // closed once those handed on before the cancel are in
		add(d)
	}
	return entries, nil
}

// registryMarker is the body of a registry read's end marker (see
// readRegistry): no name, so junk to every other reader.
type registryMarker struct {
	Marker string `json:"marker"`
}

// listParallel bounds the semaphores List describes at once.
const listParallel = 16

// registryPoll is how long the registry must stay silent before a reader
// asks the queue whether every entry is handed to it; registryQuiet how
// long a reader that cannot publish its end marker waits with nothing
// coming after the queue said so; registryReadMax bounds the wait for an
// earlier reader's entries to be back, and the wait for the marker.
const (
	registryPoll    = 50 * time.Millisecond
	registryQuiet   = 200 * time.Millisecond
	registryReadMax = 10 * time.Second
)

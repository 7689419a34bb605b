package amqpsem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/adaptive"
	"github.com/tokensem/tokensem/internal/backoff"
	"github.com/tokensem/tokensem/internal/ids"
	"github.com/tokensem/tokensem/internal/stored"
)

// config is the semaphore's definition. It lives as exactly one persistent
// message in the quorum queue tokensem.NAME.cfg, replicated like the
// tokens, so that the loss of any one node of a cluster loses nothing.
//
//   - A reader takes the message with basic.get and requeues it at once. A
//     reader that finds the queue empty while another reader holds the
//     message (the queue counts it as a consumer) tries again a moment
//     later.
//   - A writer, under the creation lock, takes the message and, in one AMQP
//     transaction, publishes the next version and acknowledges the old one.
//     RabbitMQ applies a transaction on one queue whole or not at all (a
//     writer that dies before its commit leaves the old message, requeued),
//     so the queue never holds two versions and every reader gets the
//     current one.
//
// Init writes the first version with State "creating" before it creates the
// token queue, and marks it "ready" once every token is published. A
// configuration queue that exists but is empty, with no reader holding its
// message and no token queue, is a creation that died between the two
// first steps: the next Init starts it over. A delete that must wait for
// stalled holders (see delete) marks it "deleting" first, and removes it
// last.
type config struct {
	Version   int    `json:"v"`
	Seq       int    `json:"seq"`
	State     string `json:"state,omitempty"` // stateCreating, stateReady or stateDeleting
	Permits   int    `json:"permits"`
	Epoch     uint64 `json:"epoch"` // the life's identity: random, below 2^53, new at every Init that creates
	KeyCheck  string `json:"key_check,omitempty"`
	QueueType string `json:"queue_type"`
	Created   int64  `json:"created_unix_ms"`
	// HoldBoundMS is W, in milliseconds: the longest a holder whose
	// connection stopped working may still believe it holds (its Conn's
	// watchdog bound, see Conn.holdBound). Init stores its own Conn's;
	// Open refuses a Conn whose bound is longer, and a repair or a delete
	// waits on it (holdWait).
	HoldBoundMS int64 `json:"hold_bound_ms,omitempty"`
	// FenceBase is the fence base of the tokens Init made: the creating
	// client's clock at Init, in microseconds (see fenceBase).
	FenceBase uint64 `json:"fence_base,omitempty"`
	// Issued is how many slots, from 0, have had a token in this life; a
	// token for a slot at or above it (a grown semaphore's) is issued at
	// once. 0 (a ForceDelete's configuration that found no slot): every
	// slot counts as issued.
	Issued int `json:"issued,omitempty"`
	// Reissued names, for each slot a repair issued a token for, the one
	// current token: its ID and fence base. Every other token of the slot
	// is retired (see classify).
	Reissued map[int]reissue `json:"reissued,omitempty"`
	// Controller is the record of the controller that leads the count
	// (see RecordController), as adaptive.EncodeRecord writes it; ctl is
	// it read back. One read back that is not such a record is dropped
	// (ctlErr says why, for ControllerRecord alone), so the next write of
	// the configuration leaves it out: a bad record costs only itself.
	Controller json.RawMessage `json:"ctl,omitempty"`
	ctl        adaptive.Record
	ctlErr     error

	// readAt is when the read that returned this configuration began (or,
	// for one this client wrote, when the write ended): it was current
	// then. Not stored.
	readAt time.Time
}

// reissue is a slot's current token after a repair issued it.
type reissue struct {
	ID   string `json:"id"`
	Base uint64 `json:"base"`
}

const (
	configVersion = 1
	stateCreating = "creating"
	stateReady    = "ready"
	stateDeleting = "deleting"
)

func (c config) ready() bool { return c.State == stateReady }

// holdBound returns W (see HoldBoundMS).
func (c config) holdBound() time.Duration { return time.Duration(c.HoldBoundMS) * time.Millisecond }

// holdWait is how long a repair holds a slot's claim, and a delete waits,
// before they may let a new holder have the slot: W plus a third of it,
// so that the loss reaches the holder's Done even when the watchdog's
// timer fires late on a loaded machine (for Conns with the heartbeat that
// made W: two heartbeats, when RabbitMQ itself drops a silent client).
func (c config) holdWait() time.Duration { return c.holdBound() + c.holdBound()/3 }

// issued reports whether slot index has had a token in this life.
func (c config) issued(index int) bool { return c.Issued == 0 || index < c.Issued }

// fenceBase returns the fence base of tok under cfg: its slot's reissue
// entry's, or the life's.
func (c config) fenceBase(tok tokensem.Token) uint64 {
	if r, ok := c.Reissued[tok.Index]; ok && r.ID == tok.ID {
		return r.Base
	}
	return c.FenceBase
}

// maxFenceBase returns the highest fence base cfg knows of.
func (c config) maxFenceBase() uint64 {
	m := c.FenceBase
	for _, r := range c.Reissued {
		m = max(m, r.Base)
	}
	return m
}

// nextFenceBase returns the fence base of a token issued now: the clock in
// microseconds, so that it is above every fence an earlier token of the
// slot gave (its base plus its deliveries, of which there are far fewer
// than microseconds between the two issues), provided the issuers' clocks
// did not step back by more than the time between the issues. after is
// the highest base known: a clock behind it moves the base 2^32 above it
// instead.
func nextFenceBase(after uint64) uint64 {
	now := uint64(time.Now().UnixMicro())
	if now <= after {
		return after + 1<<32
	}
	return now
}

// withReissued returns c with slot index's current token set to tok, base
// base (the map is copied: cached configurations are shared).
func (c config) withReissued(index int, tok tokensem.Token, base uint64) config {
	m := make(map[int]reissue, len(c.Reissued)+1)
	maps.Copy(m, c.Reissued)
	m[index] = reissue{ID: tok.ID, Base: base}
	c.Reissued = m
	return c
}

// encode returns c as stored. It writes <, > and & as themselves: the
// standard encoder's six-byte escapes would grow the controller record
// (written as adaptive.EncodeRecord encodes it, within its bound) at
// every write.
func (c config) encode() []byte {
	b, err := stored.Encode(c)
	if err != nil {
		panic(err) // a struct of strings, numbers and a checked record always marshals
	}
	return b
}

// A stored configuration is a few hundred bytes, plus a controller record
// of at most adaptive.MaxRecordLen, and each slot a repair reissued adds
// at most reissueSize (its index, token id and fence base: about 75). A
// record larger than maxConfigSize (room for about 13,000 reissued slots)
// is refused unparsed, and never written (checkSize); one larger than
// configSize allows for the slots it names is refused once parsed.
const (
	maxConfigSize  = 1 << 20
	baseConfigSize = 4<<10 + adaptive.MaxRecordLen
	reissueSize    = 96
)

// configSize is the most bytes a configuration naming reissued slots may
// take.
func configSize(reissued int) int { return baseConfigSize + reissueSize*reissued }

// maxHoldBound is the largest W a configuration may store: the bound of the
// longest heartbeat AMQP can negotiate (a 16-bit count of seconds).
var maxHoldBound = holdBoundOf(65535 * time.Second)

// decodeConfig parses and checks a stored configuration of semaphore name
// (see docs/protocol-rabbitmq.md, "What is read is checked"). Errors wrap
// tokensem.ErrInvalidRecord.
func decodeConfig(name string, b []byte) (config, error) {
	var c config
	err := stored.Decode(b, maxConfigSize, &c)
	switch {
	case err != nil:
	case len(b) > configSize(len(c.Reissued)):
		err = stored.Invalid("%d bytes, more than the %d a configuration of %d reissued slots may have: %s",
			len(b), configSize(len(c.Reissued)), len(c.Reissued), stored.Clip(b))
	default:
		if err = c.check(); err != nil {
			err = fmt.Errorf("%w: %s", err, stored.Clip(b))
		}
	}
	if err != nil {
		return config{}, invalidConfig(name, err)
	}
	c.canonicalController()
	return c, nil
}

// canonicalController replaces the stored controller record with its
// encoding by adaptive.EncodeRecord, which the next write of c stores (so
// its size is bounded, whoever wrote it), or drops it, noting why in
// ctlErr, when it is not a record.
func (c *config) canonicalController() {
	if len(c.Controller) == 0 {
		return
	}
	r, err := adaptive.DecodeRecord(c.Controller)
	if err == nil {
		c.Controller, err = adaptive.EncodeRecord(r)
		c.ctl = r
	}
	if err != nil && !errors.Is(err, tokensem.ErrInvalidRecord) {
		err = stored.Invalid("a controller record that does not fit once written again: %v", err)
	}
	if err != nil {
		c.Controller, c.ctlErr = nil, err
	}
}

// invalidConfig says that semaphore name's configuration is invalid (err
// wraps tokensem.ErrInvalidRecord), and what removes it.
func invalidConfig(name string, err error) error {
	return fmt.Errorf("amqpsem: the configuration of %s cannot be used (ForceDelete, or seminit delete --force, removes the semaphore): %w", name, err)
}

// check checks the fields of a configuration read back.
func (c config) check() error {
	const maxBase = 1 << 63 // a fence is a base plus a count of deliveries
	switch {
	case c.Version != configVersion:
		return stored.Invalid("version %d (this client reads %d)", c.Version, configVersion)
	case c.Seq < 0:
		return stored.Invalid("sequence %d", c.Seq)
	case c.State != stateCreating && c.State != stateReady && c.State != stateDeleting:
		return stored.Invalid("state %s", stored.Clip([]byte(c.State)))
	case c.Permits <= 0 || c.Permits > tokensem.MaxPermits:
		return stored.Invalid("permits %d outside 1..%d", c.Permits, tokensem.MaxPermits)
	case c.Epoch == 0 || c.Epoch >= ids.MaxEpoch:
		return stored.Invalid("epoch %d outside 1..2^53-1", c.Epoch)
	case c.QueueType != "" && c.QueueType != Quorum && c.QueueType != Classic:
		return stored.Invalid("queue type %s", stored.Clip([]byte(c.QueueType)))
	case c.HoldBoundMS <= 0 || c.HoldBoundMS > maxHoldBound.Milliseconds():
		return stored.Invalid("hold bound %d ms outside 1..%d", c.HoldBoundMS, maxHoldBound.Milliseconds())
	case c.FenceBase >= maxBase:
		return stored.Invalid("fence base %d, not below 2^63", c.FenceBase)
	case c.Issued < 0 || c.Issued > tokensem.MaxPermits:
		return stored.Invalid("issued %d outside 0..%d", c.Issued, tokensem.MaxPermits)
	}
	for i, r := range c.Reissued {
		switch {
		case i < 0 || i >= tokensem.MaxPermits:
			return stored.Invalid("reissued slot %d outside 0..%d", i, tokensem.MaxPermits-1)
		case !ids.Valid(r.ID):
			return stored.Invalid("reissued slot %d: token id %s is not 32 hex digits", i, stored.Clip([]byte(r.ID)))
		case r.Base == 0 || r.Base >= maxBase:
			return stored.Invalid("reissued slot %d: fence base %d outside 1..2^63-1", i, r.Base)
		}
	}
	return stored.Len("key_check", c.KeyCheck, 64)
}

// checkSize refuses to store a configuration its readers would refuse as
// too large (maxConfigSize): a repair that would reissue more slots than
// fit fails instead.
func (c config) checkSize(name string) error {
	if n := len(c.encode()); n > maxConfigSize {
		return fmt.Errorf("%w: amqpsem: the configuration of %s would take %d bytes (%d reissued slots), more than the %d its readers accept",
			tokensem.ErrInvalidRecord, name, n, len(c.Reissued), maxConfigSize)
	}
	return nil
}

// configQueueArgs are the arguments of the configuration queue: a quorum
// queue, with the delivery limit a token queue gets (every read returns the
// message once), that keeps at most maxConfigQueueBytes ready.
//
// The cap keeps a message no reader would accept (a configuration is at
// most maxConfigSize) from staying in the queue, where every read would
// receive it whole: amqp091 buffers a body before handing it over. A
// quorum queue counts only its ready messages (not one a reader or a
// writer holds), and applies the cap after it takes a publish, so on
// RabbitMQ 3.10.8 "reject-publish" accepts (confirms) the publish that
// goes over and stores it, refusing only the next ones. "drop-head"
// instead drops ready messages, oldest first, until the queue is under
// the cap again: a message above the cap never stays (nor, unless a reader
// held it at that moment, does the configuration queued before it: the
// semaphore's admin, the only one who may publish here, can purge it
// anyway). A writer holds the old message while it publishes the new one,
// and amqpsem never leaves two ready, so the cap never drops a
// configuration amqpsem wrote; twice maxConfigSize keeps a foreign
// message beside a configuration of any size, to be reported
// (errExtraRecord) rather than dropped.
func configQueueArgs(version string) amqp.Table {
	args := tokenQueueArgs(Quorum, version)
	args["x-max-length-bytes"] = int64(maxConfigQueueBytes)
	args["x-overflow"] = "drop-head"
	return args
}

// maxConfigQueueBytes is the configuration queue's cap (see
// configQueueArgs).
const maxConfigQueueBytes = 2*maxConfigSize + 64<<10

// readConfig reads the configuration of a ready semaphore: one still being
// created, being deleted, or absent, is tokensem.ErrNotInitialized.
func (s *Semaphore) readConfig(ctx context.Context) (config, error) {
	cfg, err := s.loadConfig(ctx)
	switch {
	case err == nil && cfg.State == stateDeleting:
		return config{}, fmt.Errorf("%w: %s is being deleted", tokensem.ErrNotInitialized, s.name)
	case err == nil && !cfg.ready():
		return config{}, fmt.Errorf("%w: %s is still being created", tokensem.ErrNotInitialized, s.name)
	}
	return cfg, err
}

// configRetry bounds how long loadConfig waits for the configuration
// message while other readers hold it or the queue elects a leader.
func (s *Semaphore) configRetry() time.Duration { return 2 * s.opts.RequestTimeout }

// loadConfig reads the stored configuration, in whatever state. It is
// tokensem.ErrNotInitialized when the semaphore does not exist (or its
// creation died before anything but an empty configuration queue existed),
// ctx.Err() itself when ctx ends,
// and a broker error (wrapping tokensem.ErrUnavailable) when the message
// cannot be read in time.
func (s *Semaphore) loadConfig(ctx context.Context) (config, error) {
	start := time.Now()
	rctx, cancel := context.WithTimeout(ctx, s.configRetry())
	defer cancel()
	pause := backoff.Backoff{Min: 2 * time.Millisecond, Max: 50 * time.Millisecond}
	var last error
	for {
		cfg, found, err := s.loadConfigOnce(rctx)
		// A try the window's end cut short fails with that end, in
		// whichever call it met it (a channel a slow broker had not opened
		// yet, say): it says nothing about the configuration.
		cut := err != nil && rctx.Err() != nil && ctx.Err() == nil && !errors.Is(err, errLockLost)
		switch {
		case found:
			cfg.readAt = start
			return cfg, nil
		case cut:
		case err != nil && !errors.Is(err, errNoMessage) &&
			(!errors.Is(err, tokensem.ErrUnavailable) || errors.Is(err, errLockLost)):
			return config{}, err
		default:
			last = err // nil: a reader held the message
		}
		if pause.Wait(rctx, nil) != nil {
			switch {
			case ctx.Err() != nil:
				return config{}, ctx.Err()
			case errors.Is(last, errNoMessage):
				return config{}, invalidConfig(s.name, errMissingRecord)
			case last != nil:
				return config{}, last // says what failed, and whose configuration
			}
			return config{}, wrapBrokerErr("reading the configuration of "+s.name, errors.New("the message stayed held by other readers"))
		}
	}
}

// configChannel opens the channel of one try of a configuration read or
// write. If ctx (the try's retry window, within the caller's context) ends
// before the broker opens it, the broker was silent: the error wraps
// tokensem.ErrUnavailable and says what, not a bare "context deadline
// exceeded" while the caller's context may be alive (the retry loops
// return ctx.Err() itself when it was the caller's that ended).
func (s *Semaphore) configChannel(ctx context.Context, what string) (*channel, error) {
	ch, _, err := s.c.channel(ctx)
	if cerr := ctx.Err(); cerr != nil && errors.Is(err, cerr) { // not a lost lock, or a Close
		err = wrapBrokerErr(what, errors.New("the broker opened no channel in time"))
	}
	return ch, err
}

// configWait is how long a read waits for the configuration message
// before it asks whether another reader holds it or none exists.
const configWait = 100 * time.Millisecond

// secondWait is how long a read that received the configuration waits for
// amqp091 to hand on a second message (see loadConfigOnce).
const secondWait = 5 * time.Millisecond

// loadConfigOnce tries to read the configuration once: found false and no
// error means someone held the message for the whole try (or the
// broker's counts lagged).
//
// It consumes the message rather than taking it with basic.get: RabbitMQ
// answers a basic.get on a quorum queue that is electing a leader by
// closing the whole connection (541), and with it every permit held on it,
// while a consumer waits for the new leader. A consumer also queues behind
// a reader that holds the message, and gets it when that one returns it.
//
// The read ends by closing the channel, which returns the message, with
// the consumer live: it cancels only when nothing came and nothing else
// consumes, to bring in a message still on its way (below). RabbitMQ
// 3.10's quorum queue keeps a message checked out to a cancelled consumer
// whose node is lost until the queue's leader changes (rabbit_fifo
// returns on a lost node only what its consumers still consuming hold, and
// never watches the cancelled ones again when the node comes back): a reader that cancelled and then held
// the message for the few round trips before its close, on a node killed
// at that moment, left every later reader without a configuration.
// Closing instead keeps the consumer live until the channel is gone, and
// a live consumer's messages come back when its node is lost.
func (s *Semaphore) loadConfigOnce(ctx context.Context) (cfg config, found bool, err error) {
	ch, err := s.configChannel(ctx, "reading the configuration of "+s.name)
	if err != nil {
		return config{}, false, err
	}
	defer ch.Close() // returns what it was delivered
	rctx, cancel := s.rtt(ctx)
	defer cancel()
	var (
		d       amqp.Delivery
		ok      bool
		extra   bool // a second message came
		alone   bool // the count said nothing ready and no consumer but this reader
		noToken bool // ...and no token queue either
		lookErr error
	)
	err = s.c.rpc(rctx, ch, func() error {
		// Prefetch 2: a second message, which no writer leaves, is pushed
		// along with the first (see readyAfter).
		if err := ch.Qos(2, 0, false); err != nil {
			return err
		}
		tag := "tokensem-config-" + ids.New()
		ds, err := ch.Consume(configQueue(s.name), tag, false, false, false, false, nil)
		if err != nil {
			return err
		}
		t := time.NewTimer(configWait)
		defer t.Stop()
		select {
		case d, ok = <-ds:
		case <-t.C:
			// Nothing came: is the message held by another reader (a
			// quorum queue counts the holder as a consumer), or is there
			// none? Asked while this reader still consumes, so that a real
			// answer counts it: RabbitMQ answers a count it could not take
			// (the queue's leader lost, or busy for 250 ms) with 0 ready and
			// 0 consumers.
			q, err := ch.QueueDeclarePassive(configQueue(s.name), true, false, false, false, nil)
			if err != nil {
				return err
			}
			// Held by another reader (or a writer): wait on in line a
			// little longer, for the one that returns it now; then try
			// again after a pause that leaves a writer's basic.get a
			// moment to find the message ready. Alone: there is no
			// message, or it is on its way to this reader (handed over by
			// the reader before it while the count was asked, common when
			// readers queue, or a large one still arriving); wait for it
			// as a live consumer first.
			alone = askerAlone(q)
			t.Reset(configWait)
			select {
			case d, ok = <-ds:
			case <-t.C:
			case <-rctx.Done():
			}
			if ok || !alone {
				break
			}
			// Still nothing. Only the cancel tells which: its answer
			// comes after every delivery the broker sent before it, and
			// amqp091 receives a body whole before it hands it over. What
			// it brings in is then held by a cancelled consumer until the
			// close, one round trip, unchecked by readyAfter (see above
			// for the risk; this path is rare: a message still arriving
			// 200 ms after the read began).
			if err := ch.Cancel(tag, false); err != nil {
				return err
			}
			for dd := range ds { // amqp091 closes it once the buffered ones are out
				if ok {
					extra = true
				} else {
					d, ok = dd, true
				}
			}
			if ok {
				return nil
			}
			var exists bool
			if exists, lookErr = s.queueExists(rctx, tokenQueue(s.name)); lookErr == nil && !exists {
				noToken = true
			}
			return nil
		}
		if !ok {
			return nil // nothing came, or the consumer or its channel closed: try again
		}
		if extra, err = s.readyAfter(ch); err != nil || extra {
			return err
		}
		// A second message is pushed with the first. By the time the
		// broker has answered readyAfter's question amqp091 has received
		// it, and its consumer buffer hands it on once it runs: a moment
		// is waited for that. A machine too loaded to run it in that
		// moment misses it, and a later read, or a writer, finds it then.
		t.Reset(secondWait)
		select {
		case _, extra = <-ds:
		case <-t.C:
		}
		return nil
	}, nil)
	switch {
	case isCode(err, amqp.NotFound):
		return config{}, false, fmt.Errorf("%w: %s", tokensem.ErrNotInitialized, s.name)
	case err != nil:
		return config{}, false, wrapBrokerErr("reading the configuration of "+s.name, err)
	case lookErr != nil:
		return config{}, false, lookErr
	case ok && extra:
		return config{}, false, invalidConfig(s.name, errExtraRecord)
	case ok:
		cfg, err := decodeConfig(s.name, d.Body)
		return cfg, err == nil, err
	case noToken:
		// Nothing is ready and no consumer but this reader, by a real
		// answer, and no token queue: a creation died after declaring the
		// configuration queue.
		return config{}, false, fmt.Errorf("%w: %s has no configuration yet", tokensem.ErrNotInitialized, s.name)
	case alone:
		// Nothing was on its way either, and the token queue exists, so
		// the message should too, and the counts lag (they do for a moment
		// after a requeue): try again. If it stays so, the message is gone
		// (see errMissingRecord).
		return config{}, false, errNoMessage
	}
	return config{}, false, nil // held by another reader: try again
}

// askerAlone reports whether q, a quorum queue's counts taken while one
// reader (the asker) consumes it, says that the asker has been handed
// every message there is: nothing ready and no consumer but the asker. No
// consumer at all is no answer (RabbitMQ's when it could not count, or the
// asker not counted yet); another consumer may hold messages; a ready one
// is not handed on yet (or just came back). The configuration read and
// the registry read end on it.
func askerAlone(q amqp.Queue) bool { return q.Consumers == 1 && q.Messages == 0 }

// errNoMessage is loadConfigOnce's "try again" when the configuration
// queue of a semaphore whose token queue exists looked empty and unheld.
var errNoMessage = errors.New("amqpsem: the configuration queue looked empty")

// errMissingRecord is what loadConfig says when the configuration queue
// stayed empty and unheld, with a token queue, for its whole time: the
// message was purged, or dropped by the queue's cap after a publish above
// it (see configQueueArgs). It is an invalid record, so that ForceDelete
// removes the semaphore.
var errMissingRecord = stored.Invalid("the configuration queue stays empty while the token queue exists (its message was purged, or dropped by the queue's size cap after a publish above it)")

// errExtraRecord says that a configuration queue holds more than one
// message: no writer leaves two (see config), so someone else published
// one, and which is current cannot be told.
var errExtraRecord = stored.Invalid("the configuration queue holds more than one message (published by someone other than amqpsem's writers?)")

// readyAfter reports whether the configuration queue, one message of which
// this reader holds (and no second one was delivered to it, prefetch 2),
// holds another: a message the queue counts ready once the counts have
// settled (a count may lag a requeue for a moment). A second message held
// by another reader at this instant is found by a later read, or by a
// writer.
func (s *Semaphore) readyAfter(ch *channel) (bool, error) {
	for try := 0; ; try++ {
		q, err := ch.QueueDeclarePassive(configQueue(s.name), true, false, false, false, nil)
		if err != nil || q.Messages == 0 {
			return false, err
		}
		if try > 0 {
			return true, nil
		}
		time.Sleep(configWait)
	}
}

// queueExists reports whether queue q exists, by a passive declare. A
// classic durable queue whose home node is down answers 404 too: that is a
// broker error (wrapping tokensem.ErrUnavailable and naming the node), not
// absence.
func (s *Semaphore) queueExists(ctx context.Context, q string) (bool, error) {
	_, exists, err := s.queueMessages(ctx, q)
	return exists, err
}

// queueMessages returns the number of ready messages in queue q, and
// whether it exists.
func (s *Semaphore) queueMessages(ctx context.Context, q string) (int, bool, error) {
	info, exists, err := s.queueInfo(ctx, q)
	return info.Messages, exists, err
}

// queueInfo returns queue q's counts, and whether it exists.
func (s *Semaphore) queueInfo(ctx context.Context, q string) (amqp.Queue, bool, error) {
	ch, _, err := s.c.channel(ctx)
	if err != nil {
		return amqp.Queue{}, false, err
	}
	defer ch.Close()
	rctx, cancel := s.rtt(ctx)
	defer cancel()
	var info amqp.Queue
	err = s.c.rpc(rctx, ch, func() (err error) {
		info, err = ch.QueueDeclarePassive(q, true, false, false, false, nil)
		return err
	}, nil)
	switch {
	case err == nil:
		return info, true, nil
	case isHomeNodeDown(err):
		return amqp.Queue{}, false, wrapBrokerErr("queue "+q, err)
	case isCode(err, amqp.NotFound):
		return amqp.Queue{}, false, nil
	}
	return amqp.Queue{}, false, wrapBrokerErr("queue "+q, err)
}

// isHomeNodeDown reports whether err is RabbitMQ's 404 for a durable
// classic queue that exists on a node that is down ("home node 'N' of
// durable queue 'Q' in vhost 'V' is down or inaccessible"). AMQP has no
// other code for it than 404, so its text is the only way to tell it from
// a queue that does not exist.
func isHomeNodeDown(err error) bool {
	var ae *amqp.Error
	return errors.As(err, &ae) && ae.Code == amqp.NotFound && strings.Contains(ae.Reason, "is down or inaccessible")
}

// createConfig publishes the first configuration (State creating) into a
// new configuration queue, under the creation lock.
func (s *Semaphore) createConfig(ctx context.Context, cfg config, version string) error {
	if err := cfg.checkSize(s.name); err != nil {
		return err
	}
	if err := s.declareConfigQueue(ctx, version); err != nil {
		return wrapBrokerErr("creating the configuration of "+s.name, err)
	}
	ch, err := s.c.confirmChannel(ctx)
	if err != nil {
		return err
	}
	defer ch.Close()
	q := configQueue(s.name)
	var dc *amqp.DeferredConfirmation
	err = s.c.rpc(ctx, ch, func() (err error) {
		if err := s.bind(ch, q); err != nil {
			return err
		}
		dc, err = ch.PublishWithDeferredConfirmWithContext(ctx, exchangeName(s.name), q, true, false, configMessage(cfg))
		return err
	}, nil)
	if err != nil {
		return wrapBrokerErr("creating the configuration of "+s.name, err)
	}
	return s.c.waitConfirms(ctx, ch, []*amqp.DeferredConfirmation{dc})
}

// declareConfigQueue declares the configuration queue with the cap (see
// configQueueArgs). Queue arguments are fixed when a queue is made: an
// empty configuration queue made with others (by someone else) fails the
// declare (406), and Delete removes it.
func (s *Semaphore) declareConfigQueue(ctx context.Context, version string) error {
	ch, _, err := s.c.channel(ctx)
	if err != nil {
		return err
	}
	defer ch.Close()
	q := configQueue(s.name)
	err = s.c.rpc(ctx, ch, func() error {
		_, err := ch.QueueDeclare(q, true, false, false, false, configQueueArgs(version))
		return err
	}, nil)
	if isCode(err, amqp.PreconditionFailed) {
		return fmt.Errorf("queue %s exists with other settings (Delete removes it): %w", q, err)
	}
	return err
}

func configMessage(cfg config) amqp.Publishing {
	return amqp.Publishing{DeliveryMode: amqp.Persistent, ContentType: "application/json", Body: cfg.encode()}
}

// writeConfig replaces the stored configuration with next, under the
// creation lock: it takes the current message and, in one transaction,
// publishes next and acknowledges the old one. A queue that holds more
// than that message is refused (errExtraRecord): see replaceConfig.
func (s *Semaphore) writeConfig(ctx context.Context, next config) error {
	return s.writeConfigAll(ctx, next, false)
}

// replaceConfig is writeConfig that replaces every message the queue holds,
// or writes one into an empty queue (ForceDelete of an invalid or missing
// configuration).
func (s *Semaphore) replaceConfig(ctx context.Context, next config) error {
	return s.writeConfigAll(ctx, next, true)
}

func (s *Semaphore) writeConfigAll(ctx context.Context, next config, all bool) error {
	if err := next.checkSize(s.name); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.configRetry())
	defer cancel()
	pause := backoff.Backoff{Min: 2 * time.Millisecond, Max: 50 * time.Millisecond}
	for {
		done, err := s.writeConfigOnce(ctx, next, all)
		if done || err != nil && (!errors.Is(err, tokensem.ErrUnavailable) || errors.Is(err, errLockLost)) {
			return err
		}
		if pause.Wait(ctx, nil) != nil {
			if err == nil {
				err = errors.New("the message stayed held by readers")
			}
			return wrapBrokerErr("writing the configuration of "+s.name, err)
		}
	}
}

// writeConfigOnce is one try of writeConfig: done false and no error means
// a reader held the message.
func (s *Semaphore) writeConfigOnce(ctx context.Context, next config, all bool) (bool, error) {
	ch, err := s.configChannel(ctx, "opening a channel")
	if err != nil {
		return false, err
	}
	defer ch.Close() // before a commit: rolls back, and the old message returns
	q := configQueue(s.name)
	var done, extra bool
	err = s.c.rpc(ctx, ch, func() error {
		if err := s.bind(ch, q); err != nil {
			return err
		}
		d, taken, err := ch.Get(q, false)
		switch {
		case err != nil:
			return err
		case !taken && !all:
			return nil // a reader holds it
		case taken && d.MessageCount > 0 && !all:
			extra = true
			return nil
		}
		if err := ch.Tx(); err != nil {
			return err
		}
		for all {
			_, ok, err := ch.Get(q, false)
			if err != nil {
				return err
			}
			if !ok {
				break
			}
			taken = true
		}
		if err := ch.PublishWithContext(ctx, exchangeName(s.name), q, true, false, configMessage(next)); err != nil {
			return err
		}
		// Every message taken: the one this write replaces and, for all,
		// the others. For all, a queue found empty (see errMissingRecord)
		// gets the new one alone.
		if taken {
			if err := ch.Ack(0, true); err != nil {
				return err
			}
		}
		if err := ctx.Err(); err != nil {
			return err // abandoned: the close rolls the transaction back
		}
		if err := ch.TxCommit(); err != nil {
			return err
		}
		done = true
		return nil
	}, nil)
	switch {
	case err != nil:
		return false, wrapBrokerErr("writing the configuration of "+s.name, err)
	case extra:
		return false, invalidConfig(s.name, errExtraRecord)
	}
	return done, nil
}

package natssem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/driver"
	"github.com/tokensem/tokensem/internal/backoff"
	"github.com/tokensem/tokensem/internal/ids"
)

// Creating a semaphore (Init): the stream, its consumer and the KV bucket
// first (idempotent), then the configuration, created once by compare-and-
// set; its creator (the seeder) publishes the tokens, resumably, and marks
// it ready, while the other Inits wait for that.

// createResources creates (or finds) the token stream, its holders
// consumer and the KV bucket. In a group they are the group's stream and
// bucket. The token consumer is made by the creator of the configuration,
// with its lease (prepareLife).
//
// A bucket's sequence, whose numbers are the slot records' revisions and
// so the permits' fences, starts at the server's clock in microseconds
// when the bucket is made (bucketConfig): fences of a name never go back
// when it is deleted and made again, or when an operator removes a group's
// bucket by hand, as long as the server's clock does not step back by more
// than the time between the two lives and a bucket takes fewer than one
// write a microsecond (a JetStream stream takes far fewer). A token stream
// made anew starts at this client's clock in microseconds, so that token
// sequences of an earlier life are not reused either (a best effort: a
// sequence read in an ended life is only ever used to delete a duplicate,
// and the records, which carry the life, decide who holds).
func (s *Semaphore) createResources(ctx context.Context, permits int) error {
	if s.group != nil {
		// Found by an earlier Init of the group on this connection.
		if stream, kv := s.group.found(); stream != nil {
			s.stream = stream
			s.setBucket(kv)
			return nil
		}
	}
	rctx, cancel := s.rtt(ctx)
	defer cancel()
	sc := jetstream.StreamConfig{
		Name:        s.lay.stream,
		Description: "tokensem tokens of " + s.name,
		Subjects:    []string{s.lay.subject},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    s.opts.replicas,
		Discard:     jetstream.DiscardOld,
		Duplicates:  2 * time.Minute,
		AllowDirect: true,
		FirstSeq:    microseconds(time.Now()),
	}
	var (
		stream jetstream.Stream
		err    error
	)
	if s.lay.grouped() {
		stream, err = s.createGroupStream(rctx, sc)
	} else {
		stream, err = s.js.CreateStream(rctx, sc)
	}
	switch {
	case errors.Is(err, jetstream.ErrStreamNameAlreadyInUse):
		// Made by another Init (with its own first sequence), or earlier.
		stream, err = s.js.Stream(rctx, s.lay.stream)
		if err != nil {
			return wrapBrokerErr(err)
		}
	case err != nil:
		return wrapBrokerErr(err)
	}
	s.stream = stream
	var kv jetstream.KeyValue
	if s.lay.grouped() {
		// Most keys join a group whose bucket exists: one lookup.
		kv, err = s.js.KeyValue(rctx, s.lay.bucket)
	}
	created := false
	if !s.lay.grouped() || errors.Is(err, jetstream.ErrBucketNotFound) {
		// The stream's info carries the server's clock.
		kv, created, err = s.createBucket(rctx, microseconds(stream.CachedInfo().TimeStamp))
	}
	if err != nil {
		return wrapBrokerErr(err)
	}
	s.setBucket(kv)
	if created && s.lay.grouped() {
		// A new group bucket starts with a generation of its own, so that
		// no client's cached generation of an earlier bucket of the name
		// can match it (generation.go).
		if err := s.bumpGeneration(ctx); err != nil {
			return err
		}
	}
	if s.group != nil {
		s.group.remember(stream, kv)
	}
	return nil
}

// microseconds returns t as a stream sequence: microseconds since 1970,
// below 2^53 until the year 2255.
func microseconds(t time.Time) uint64 { return uint64(max(t.UnixMicro(), 1)) }

// createBucket creates the KV bucket, starting its sequence at first, or
// finds it (created false) if it exists. It makes the bucket's stream
// itself, as jetstream.CreateKeyValue would but with a first sequence
// (KeyValueConfig has none): bucketConfig.
func (s *Semaphore) createBucket(ctx context.Context, first uint64) (jetstream.KeyValue, bool, error) {
	_, err := s.js.CreateStream(ctx, s.bucketConfig(first))
	created := err == nil
	if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return nil, false, err
	}
	kv, err := s.js.KeyValue(ctx, s.lay.bucket)
	return kv, created, err
}

// bucketConfig is the configuration of the KV bucket's stream: what
// jetstream.CreateKeyValue makes of a KeyValueConfig with History 1, file
// storage and s.opts.replicas (nats.go 1.55, kv.go, prepareLifeValueConfig),
// plus its first sequence.
func (s *Semaphore) bucketConfig(first uint64) jetstream.StreamConfig {
	desc := "tokensem config and slot leases of " + s.name
	if s.lay.grouped() {
		desc = "tokensem config and slot leases of group " + s.lay.group
	}
	return jetstream.StreamConfig{
		Name:              s.lay.kvStream(),
		Description:       desc,
		Subjects:          []string{s.lay.bucketSubject(">")},
		MaxMsgsPerSubject: 1,
		MaxBytes:          -1,
		MaxMsgSize:        -1,
		MaxMsgs:           -1,
		MaxConsumers:      -1,
		Storage:           jetstream.FileStorage,
		Replicas:          max(s.opts.replicas, 1),
		AllowRollup:       true,
		DenyDelete:        true,
		Duplicates:        2 * time.Minute,
		AllowDirect:       true,
		Discard:           jetstream.DiscardNew,
		FirstSeq:          first,
	}
}

// createGroupStream finds the group's stream, or creates it. Unlike a lone
// semaphore's, it keeps messages until they are deleted (limits retention)
// rather than being a work queue: a work queue checks each new consumer's
// filter against every other consumer's, which made creating a key grow
// with the group (docs/notes/per-key-costs.md). Tokens are never acknowledged
// (a holder releases with a Nak), and whatever is acknowledged (junk) is
// deleted as well (see discard), so nothing else changes. Its consumer
// limit is MaxGroupKeys: unset, the server's default_max_consumers (1,000)
// would cap the keys a group can hold. An account with a lower consumer
// limit refuses that (and would refuse re-creating the stream as it is:
// hence the lookup first); the stream is then made without a limit of its
// own, and the account's applies.
func (s *Semaphore) createGroupStream(ctx context.Context, sc jetstream.StreamConfig) (jetstream.Stream, error) {
	stream, err := s.js.Stream(ctx, sc.Name)
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return stream, err
	}
	sc.Description = "tokensem tokens of group " + s.lay.group
	sc.Subjects = []string{ResourcesOf("*", s.lay.group).Subject}
	sc.Retention = jetstream.LimitsPolicy
	sc.MaxConsumers = MaxGroupKeys
	stream, err = s.js.CreateStream(ctx, sc)
	if errors.Is(err, jetstream.ErrMaximumConsumersLimit) {
		sc.MaxConsumers = 0
		stream, err = s.js.CreateStream(ctx, sc)
	}
	return stream, err
}

// MaxGroupKeys is how many semaphores one group (WithGroup) can hold: each
// key is a consumer of the group's stream. An account's own consumer limit
// may be lower; an Init beyond it returns an error that matches
// jetstream.ErrMaximumConsumersLimit.
const MaxGroupKeys = 1_000_000

// createConsumer creates the holders consumer with an ack wait of lease,
// replacing one that exists with another configuration: it runs while a
// life is being seeded, whose tokens nobody holds yet. It returns the
// consumer's priority group, or "" when the server cannot order pulls by
// class (see config.PriorityGroup).
//
// The consumer's replicas are set to the stream's, not left to inherit
// them: a server that shuts down answers each pull on a consumer whose
// replicas read 0 or 1 with "409 Server Shutdown", and the new leader then
// answers it again with "409 Leadership Change", which would end a
// re-issued pull's count while that pull is queued.
func (s *Semaphore) createConsumer(ctx context.Context, lease time.Duration) (string, error) {
	stream := s.stream // set by createResources
	if stream == nil {
		var err error
		if stream, err = s.js.Stream(ctx, s.lay.stream); err != nil {
			return "", wrapBrokerErr(err)
		}
	}
	cc := jetstream.ConsumerConfig{
		Durable:       s.lay.consumer,
		Description:   "tokensem holders of " + s.name,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       lease,
		MaxDeliver:    -1,
		MaxWaiting:    s.opts.maxWaiters,
		MaxAckPending: -1,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		Replicas:      stream.CachedInfo().Config.Replicas,
		// Pulls are served by class (lower first), in arrival order
		// within one.
		PriorityPolicy: jetstream.PriorityPolicyPrioritized,
		PriorityGroups: []string{priorityGroup},
	}
	if s.lay.grouped() {
		cc.FilterSubject = s.lay.subject
	}
	info, err := s.putConsumer(ctx, cc, lease)
	refused := false // by a server of the cluster, which cannot run the consumer
	if isUnknownPolicy(err) && s.nc.ConnectedClusterName() != "" {
		// Every server of a cluster reads a JetStream API request, and
		// one before 2.12 answers this one at once with its refusal while
		// the metadata leader, if newer, creates the consumer anyway
		// (nats-server 2.11 beside 2.15). Falling back then met that
		// consumer, replaced it, and the older server's failure to read
		// the replaced one's assignment stalled the replacement: an Init
		// retried for a minute. Take the consumer if it comes; the older
		// server holds no replica of it, even once upgraded, until the
		// consumer is updated again. The configuration then names no
		// group, as after a refused upgrade (upgradeClasses), so that an
		// Init once every server runs 2.12 or later sends that update.
		if got, ok := s.awaitConsumer(ctx, cc); ok {
			info, err, refused = got, nil, true
		}
	}
	if isUnknownPolicy(err) {
		// A server before 2.12 (2.11 refuses the policy; 2.10 drops it
		// unread, which the read-back below catches): arrival order only.
		s.log.Info("the server cannot serve priority classes; waiters are served in arrival order only")
		cc.PriorityPolicy, cc.PriorityGroups = jetstream.PriorityPolicyNone, nil
		info, err = s.putConsumer(ctx, cc, lease)
	}
	switch {
	case err == nil && info.Config.PriorityPolicy == jetstream.PriorityPolicyPrioritized && !refused:
		return priorityGroup, nil
	case err == nil:
		return "", nil
	case errors.Is(err, jetstream.ErrMaximumConsumersLimit):
		// Not a broker that failed to answer: retrying cannot help.
		return "", fmt.Errorf("natssem: %s cannot join group %s: %w", s.name, s.lay.group, err)
	}
	return "", wrapBrokerErr(err)
}

// awaitConsumer reads the token consumer until it exists, for up to a
// request timeout or until ctx ends, and returns it if it is the one cc
// asked for. One made with another configuration (an earlier life's, of
// another lease, which the metadata leader then kept) is not: its ack
// wait would not be this life's lease, and putConsumer replaces it.
func (s *Semaphore) awaitConsumer(ctx context.Context, cc jetstream.ConsumerConfig) (*jetstream.ConsumerInfo, bool) {
	wctx, cancel := context.WithTimeout(ctx, s.requestTimeout())
	defer cancel()
	pause := backoff.Backoff{Min: 20 * time.Millisecond, Max: 200 * time.Millisecond}
	for {
		if info, err := s.consumerInfo(wctx); err == nil {
			got := info.Config
			return info, got.AckWait == cc.AckWait && got.MaxWaiting == cc.MaxWaiting &&
				got.FilterSubject == cc.FilterSubject && got.PriorityPolicy == cc.PriorityPolicy
		}
		if pause.Wait(wctx, s.done) != nil {
			return nil, false
		}
	}
}

// putConsumer creates the token consumer with cc, replacing one left with
// another configuration.
func (s *Semaphore) putConsumer(ctx context.Context, cc jetstream.ConsumerConfig, lease time.Duration) (*jetstream.ConsumerInfo, error) {
	c, err := s.js.CreateConsumer(ctx, s.lay.stream, cc)
	if errors.Is(err, jetstream.ErrConsumerExists) {
		// Left with another configuration, which cannot all be updated
		// (the server refuses a new MaxWaiting): made anew.
		s.log.Info("replacing a token consumer made with another configuration", "lease", lease)
		if err = s.js.DeleteConsumer(ctx, s.lay.stream, s.lay.consumer); err == nil || errors.Is(err, jetstream.ErrConsumerNotFound) {
			c, err = s.js.CreateConsumer(ctx, s.lay.stream, cc)
		}
	}
	if err != nil {
		return nil, err
	}
	return c.CachedInfo(), nil
}

// priorityGroup is the token consumer's one priority group, which every
// pull names.
const priorityGroup = "tokensem"

// isUnknownPolicy reports whether err is a server's refusal of the
// prioritized policy: nats-server 2.11 does not know it and answers that
// the request is invalid JSON (JSInvalidJSONErr, 10025; nats.go names no
// constant for it).
func isUnknownPolicy(err error) bool {
	const invalidJSON jetstream.ErrorCode = 10025
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == invalidJSON
}

// prepareLife readies the semaphore for the seeding of a life: its token
// consumer, made now with that life's lease (one left by an earlier life,
// or made by a concurrent Init that asked for another lease, or by an Init
// cut short, may have another ack wait, and a Delete that ran since this
// Init began may have removed it), and, of a key of a group, when this
// Init has just created the configuration (fresh), the key's subject
// emptied of what an earlier life left in it (a seeding that stalled past
// a Delete). A seeding resumed or taken over keeps the subject: tokens of
// its own life may be there already, and publishing them again would be
// dropped as duplicates.
//
// It returns the consumer's priority group (see config.PriorityGroup),
// which the life's ready configuration names.
func (s *Semaphore) prepareLife(ctx context.Context, lease time.Duration, fresh bool) (string, error) {
	rctx, cancel := s.rtt(ctx)
	group, err := s.createConsumer(rctx, lease)
	cancel()
	if err != nil || !fresh || !s.lay.grouped() {
		return group, err
	}
	n, err := s.clearTokens(ctx)
	if n > 0 {
		s.log.Warn("removed messages an earlier life of the key left", "messages", n)
	}
	return group, err
}

// clearTokens deletes every message on a group key's subject, one by one,
// and returns how many it deleted. A purge of the subject would be one
// request, but when it removes more than one message the server recounts
// the pending messages of every consumer of the stream, one per key: 3.2 s
// a purge in a group of 10,000 keys, where deleting a key's two tokens
// takes two round trips (docs/notes/per-key-costs.md).
func (s *Semaphore) clearTokens(ctx context.Context) (int, error) {
	msgs, err := s.scanTokens(ctx)
	if err != nil {
		return 0, err
	}
	for i, m := range msgs {
		if err := s.deleteMsg(ctx, m.Seq); err != nil {
			return i, err
		}
	}
	return len(msgs), nil
}

// errRecreate sends Init back to createResources: the configuration it
// was creating went away or changed hands, and is read afresh.
var errRecreate = errors.New("natssem: the semaphore changed while being created")

// seedStallTimeout is how long a creator may take to publish the tokens
// before another Init takes the job over. It is well inside the stream's
// 2-minute duplicate window, so a takeover republishing the same message IDs
// cannot create duplicates.
const seedStallTimeout = 30 * time.Second

// createConfig makes sure the configuration exists and the tokens are
// published exactly once, whoever else runs Init at the same time.
func (s *Semaphore) createConfig(ctx context.Context, permits int) (config, error) {
	me := s.seeder
	want := config{
		Version: s.lay.configVersion(), Permits: permits, Lease: s.opts.Lease, Epoch: ids.Epoch(),
		KeyCheck: s.codec.KeyCheck(), State: stateSeeding, Seeder: me,
		Created: time.Now().UnixMilli(),
	}
	for {
		rctx, cancel := s.rtt(ctx)
		rev, err := s.kv.Create(rctx, s.lay.key(configKey), want.encode())
		cancel()
		if err == nil {
			if want.PriorityGroup, err = s.prepareLife(ctx, want.Lease, true); err != nil {
				s.dropConfig(ctx, rev)
				return config{}, err
			}
			return s.seed(ctx, want, rev)
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return config{}, wrapBrokerErr(err)
		}
		cfg, rev, err := s.readConfig(ctx)
		if errors.Is(err, tokensem.ErrNotInitialized) {
			continue // deleted since (a Delete that found no holder): create it again
		}
		if err != nil {
			return config{}, err
		}
		if cfg.State == stateDeleting {
			if err := s.awaitDelete(ctx); err != nil {
				return config{}, err
			}
			return config{}, errRecreate
		}
		if cfg.Permits != permits {
			return config{}, &tokensem.PermitMismatchError{Name: s.name, Have: cfg.Permits, Want: permits}
		}
		if err := s.codec.CheckKey(s.name, cfg.KeyCheck); err != nil {
			return config{}, err
		}
		if cfg.State == stateReady {
			return cfg, nil
		}
		if cfg.Seeder == me {
			// This Init's own seeding, interrupted: resume it.
			if cfg.PriorityGroup, err = s.prepareLife(ctx, cfg.Lease, false); err != nil {
				return config{}, err
			}
			return s.seed(ctx, cfg, rev)
		}
		// Someone else is seeding: wait for them, or take over if they stalled.
		if time.Since(time.UnixMilli(cfg.Created)) > seedStallTimeout {
			cfg.Seeder, cfg.Created = me, time.Now().UnixMilli()
			rctx, cancel := s.rtt(ctx)
			rev, err = s.kv.Update(rctx, s.lay.key(configKey), cfg.encode(), rev)
			cancel()
			if err == nil {
				s.log.Warn("took over a stalled token seeding")
				if cfg.PriorityGroup, err = s.prepareLife(ctx, cfg.Lease, false); err != nil {
					return config{}, err
				}
				return s.seed(ctx, cfg, rev)
			}
			continue
		}
		select {
		case <-ctx.Done():
			return config{}, fmt.Errorf("natssem: waiting for another Init of %s: %w", s.name, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// dropConfig removes the configuration this Init created at rev, when it
// cannot go on (prepareLife failed), so that the next Init need not wait
// seedStallTimeout for it. Best effort: a configuration left in place is
// taken over after that wait.
func (s *Semaphore) dropConfig(ctx context.Context, rev uint64) {
	rctx, cancel := s.rtt(context.WithoutCancel(ctx))
	defer cancel()
	if err := s.kv.Delete(rctx, s.lay.key(configKey), jetstream.LastRevision(rev)); err != nil {
		s.log.Warn("could not remove the configuration of a failed Init", "err", err)
	}
}

// seed publishes the tokens of cfg's epoch, deduplicated by message ID, then
// marks the configuration ready.
func (s *Semaphore) seed(ctx context.Context, cfg config, rev uint64) (config, error) {
	const batch = 1000
	for lo := 0; lo < cfg.Permits; lo += batch {
		msgs := make([]*nats.Msg, 0, batch)
		for i := lo; i < min(lo+batch, cfg.Permits); i++ {
			b, err := s.codec.Encode(driver.NewToken(s.name, i, cfg.Epoch))
			if err != nil {
				return config{}, err
			}
			id := s.lay.msgID(s.name, cfg.Epoch, s.name+"."+strconv.FormatUint(cfg.Epoch, 10)+"."+strconv.Itoa(i))
			msgs = append(msgs, &nats.Msg{Subject: s.lay.subject, Data: b, Header: nats.Header{jetstream.MsgIDHeader: []string{id}}})
		}
		if err := s.publishAll(ctx, msgs); err != nil {
			return config{}, err
		}
	}
	cfg.State = stateReady
	rctx, cancel := s.rtt(ctx)
	defer cancel()
	if _, err := s.kv.Update(rctx, s.lay.key(configKey), cfg.encode(), rev); err != nil {
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			// Another Init took the seeding over (this one stalled past
			// seedStallTimeout), or a Delete marked the configuration.
			return config{}, errRecreate
		}
		return config{}, wrapBrokerErr(err)
	}
	s.awaitTokens(ctx, cfg.Permits)
	s.log.Info("semaphore created", "permits", cfg.Permits, "lease", cfg.Lease)
	return cfg, nil
}

// publishAll publishes msgs to the token stream without waiting between
// them, then waits (at most a request timeout) for the stream to
// acknowledge each. It reads the acknowledgements from an inbox of its own
// rather than with jetstream's PublishAsync, which keeps a subscription
// and a goroutine per JetStream context until CleanupPublisher, and whose
// goroutine CleanupPublisher can leave blocked for ever when it runs before
// that goroutine has started (nats.go 1.55, publish.go: it then reads a nil
// status channel).
func (s *Semaphore) publishAll(ctx context.Context, msgs []*nats.Msg) error {
	inbox := s.nc.NewInbox()
	acks := make(chan *nats.Msg, len(msgs))
	sub, err := s.nc.ChanSubscribe(inbox+".*", acks)
	if err != nil {
		return wrapBrokerErr(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	for i, m := range msgs {
		m.Reply = inbox + "." + strconv.Itoa(i)
		if err := s.nc.PublishMsg(m); err != nil {
			return wrapBrokerErr(err)
		}
	}
	rctx, cancel := s.rtt(ctx)
	defer cancel()
	for range msgs {
		select {
		case a := <-acks:
			if err := pubAckError(a); err != nil {
				return err
			}
		case <-rctx.Done():
			if err := ctx.Err(); err != nil {
				return err
			}
			return wrapBrokerErr(fmt.Errorf("publishing the tokens of %s: %w", s.name, nats.ErrTimeout))
		}
	}
	return nil
}

// pubAckError is the error a JetStream publish's answer carries, if any.
func pubAckError(m *nats.Msg) error {
	if code, desc := status(m); code != "" {
		if code == "503" {
			return wrapBrokerErr(fmt.Errorf("publishing a token: %w", nats.ErrNoResponders))
		}
		return wrapBrokerErr(fmt.Errorf("publishing a token: answered %s %s", code, desc))
	}
	var ack struct {
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &ack); err != nil {
		return wrapBrokerErr(fmt.Errorf("publishing a token: %w", err))
	}
	if ack.Error != nil {
		return wrapBrokerErr(fmt.Errorf("publishing a token: %w", ack.Error))
	}
	return nil
}

// awaitTokens waits (briefly, best effort) until the consumer counts the
// tokens just published. The server tells consumers of new messages
// asynchronously, and until it has, a no-wait pull finds nothing: measured
// 2 times in 300, TryAcquire right after Init returned ErrNoPermit.
func (s *Semaphore) awaitTokens(ctx context.Context, permits int) {
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		info, err := s.consumerInfo(ctx)
		if err != nil || info.NumPending+uint64(info.NumAckPending) >= uint64(permits) {
			return
		}
		if backoff.Sleep(ctx, 2*time.Millisecond) != nil {
			return
		}
	}
}

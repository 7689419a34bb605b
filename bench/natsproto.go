package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Semaphore protocols on JetStream played with plain nats.go, without the
// library, so that the harness can tell the broker's cost from natssem's
// (natsprotorun.go plays them). Three:
//
//   - "queue": no semaphore at all. A work-queue stream of tokens; acquire
//     is the delivery, release its Nak. It is the broker's own fair
//     handoff, the floor under any protocol that hands a token on through
//     a consumer, and unsafe: acks are not fenced, so a stale Nak or Ack
//     acts on another holder's token (DESIGN.md).
//   - "kv": natssem's protocol. Tokens in a work-queue stream, each slot's
//     holder a record in a KV bucket. Acquire reads the slot's record and
//     takes it by compare-and-set; release writes it free by
//     compare-and-set, then Naks the token.
//   - "register": the token and the slot's holder are one register, the
//     last message on the slot's subjects (proto.I.tok, proto.I.held) of a
//     stream that keeps one message per subject. A free slot's register is
//     its token message, which a consumer filtered on proto.*.tok delivers
//     to the first waiting pull. Acquire publishes the holder on
//     proto.I.held only if the token's own stream sequence is still the
//     last on proto.I.* (Nats-Expected-Last-Subject-Sequence with
//     Nats-Expected-Last-Subject-Sequence-Subject), so the delivery carries
//     the revision the claim needs and no read comes first. Release
//     publishes the next token only if the holder's claim is still the
//     last (the compare-and-set and the token's return in one write), then
//     acks the delivery it replaced. A redelivery after a lease, a
//     duplicate or a stale delivery fails its compare-and-set and would
//     read the register to decide, as natssem does today
//     (docs/notes/nats-handoff.md has the whole sketch).
//
// None plays leases, renewals or crashes: the harness's loops need none.
// Every compare-and-set that loses is counted; on one server none should.

// Protocol names (natsprotorun.go plays them).
const (
	protoKV       = "kv"
	protoRegister = "register"
	protoQueue    = "queue"
)

// natsProtocols are played in this order (report and log).
var natsProtocols = []string{protoQueue, protoRegister, protoKV}

// The streams and bucket the protocols use: kv and queue share the
// work-queue stream and the bucket, register has a stream of its own.
const (
	kvStream  = "PROTO_KV"
	kvBucket  = "proto_kv"
	regStream = "PROTO_REG"
)

// protoStream is the token stream of protocol p.
func protoStream(p string) string {
	if p == protoRegister {
		return regStream
	}
	return kvStream
}

// protoSetup makes the streams (and bucket) of protocol p afresh, with
// permits tokens. A stream made again right after its deletion can be
// refused for a moment ("error creating store for stream", on a busy
// machine), so the whole setup is tried again for up to 5 s.
func (n *natsSystem) protoSetup(ctx context.Context, p string, permits int) error {
	for deadline := time.Now().Add(5 * time.Second); ; {
		err := n.protoSetupOnce(ctx, p, permits)
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (n *natsSystem) protoSetupOnce(ctx context.Context, p string, permits int) error {
	js, r := n.js, max(n.replicas, 1)
	n.protoRemove(ctx, p)
	switch p {
	case protoKV, protoQueue:
		if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: kvBucket, History: 1, Storage: jetstream.FileStorage, Replicas: r}); err != nil {
			return err
		}
		s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: kvStream, Subjects: []string{"protokv.tok"},
			Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage, Replicas: r})
		if err != nil {
			return err
		}
		if _, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "holders", AckPolicy: jetstream.AckExplicitPolicy,
			AckWait: time.Minute, MaxWaiting: 512}); err != nil {
			return err
		}
		for i := range permits {
			if _, err := js.Publish(ctx, "protokv.tok", []byte(strconv.Itoa(i))); err != nil {
				return err
			}
		}
		return n.reachable(ctx, map[string]string{"protokv.tok": "protokv.tok", kvSubject("probe"): kvSubject("probe")}, "KV_"+kvBucket)
	case protoRegister:
		s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: regStream, Subjects: []string{"proto.*.*"},
			MaxMsgsPerSubject: 1, Storage: jetstream.FileStorage, AllowDirect: true, Replicas: r})
		if err != nil {
			return err
		}
		if _, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "holders", FilterSubject: "proto.*.tok",
			AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute, MaxWaiting: 512}); err != nil {
			return err
		}
		for i := range permits {
			if _, err := casPublish(n.probe, regSubject(i, "tok"), regSubject(i, "*"), 0, nil); err != nil {
				return err
			}
		}
		return n.reachable(ctx, map[string]string{regSubject(0, "probe"): regSubject(0, "*")}, "")
	}
	return fmt.Errorf("no protocol %q", p)
}

// reachable waits, on a cluster, until every node forwards a write to each
// subject (keyed) of a stream just made, and answers a direct get of
// stream direct (if not empty): a new stream reaches the other nodes a
// moment after it is made, which answer "no responders" meanwhile. The
// probe writes cannot land (they expect a sequence no stream has).
func (n *natsSystem) reachable(ctx context.Context, subjects map[string]string, direct string) error {
	if n.cluster == nil {
		return nil
	}
	for i := range n.cluster.Size() {
		nc, err := nats.Connect("nats://" + n.cluster.Addr(i))
		if err != nil {
			return err
		}
		err = writable(ctx, nc, subjects)
		for deadline := time.Now().Add(10 * time.Second); err == nil && direct != ""; {
			if _, err = lastSeq(nc, direct, "probe"); err == nil || time.Now().After(deadline) {
				break
			}
			err = nil
			time.Sleep(10 * time.Millisecond)
		}
		nc.Close()
		if err != nil {
			return fmt.Errorf("node %d: %w", i, err)
		}
	}
	return nil
}

// writable waits until nc's server forwards a write to each subject (keyed)
// conditional on filter (valued), for up to 10 s.
func writable(ctx context.Context, nc *nats.Conn, subjects map[string]string) error {
	for subj, filter := range subjects {
		for deadline := time.Now().Add(10 * time.Second); ; {
			_, err := casPublish(nc, subj, filter, 1<<40, nil)
			if errors.Is(err, errLost) {
				break
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("%s never took a write: %w", subj, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return nil
}

// protoRemove removes what protoSetup made for p, best effort.
func (n *natsSystem) protoRemove(ctx context.Context, p string) {
	ctx = context.WithoutCancel(ctx)
	_ = n.js.DeleteStream(ctx, protoStream(p))
	if p != protoRegister {
		_ = n.js.DeleteKeyValue(ctx, kvBucket)
	}
}

func regSubject(i int, kind string) string { return "proto." + strconv.Itoa(i) + "." + kind }

// errLost is a compare-and-set that found another last sequence.
var errLost = errors.New("compare-and-set lost")

// casPublish publishes body on subj only if the last message on filter has
// sequence last (0: none), and returns the new message's sequence. A
// replicated stream refuses a write while another to the same filter is
// being proposed, with 10164 and no sequence, whether or not that other
// write will land; such a refusal is asked again (0.2 ms doubling, five
// times), so that errLost means another write did land.
func casPublish(nc *nats.Conn, subj, filter string, last uint64, body []byte) (uint64, error) {
	pause := 200 * time.Microsecond
	for try := 0; ; try++ {
		seq, busy, err := casPublishOnce(nc, subj, filter, last, body)
		if !busy || try == 5 {
			return seq, err
		}
		time.Sleep(pause)
		pause *= 2
	}
}

// casPublishOnce is one try of casPublish; busy reports a 10164.
func casPublishOnce(nc *nats.Conn, subj, filter string, last uint64, body []byte) (seq uint64, busy bool, err error) {
	m := nats.NewMsg(subj)
	m.Data = body
	m.Header.Set("Nats-Expected-Last-Subject-Sequence", strconv.FormatUint(last, 10))
	if filter != subj {
		m.Header.Set("Nats-Expected-Last-Subject-Sequence-Subject", filter)
	}
	r, err := nc.RequestMsg(m, 5*time.Second)
	if err != nil {
		return 0, false, err
	}
	var ack struct {
		Seq   uint64              `json:"seq"`
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(r.Data, &ack); err != nil {
		return 0, false, err
	}
	switch {
	case ack.Error == nil:
		return ack.Seq, false, nil
	case ack.Error.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence:
		return 0, false, fmt.Errorf("%w: %w", errLost, ack.Error)
	case ack.Error.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant:
		return 0, true, fmt.Errorf("%w: %w", errLost, ack.Error)
	}
	return 0, false, ack.Error
}

// lastSeq reads the sequence of the last message on subj (a direct get).
func lastSeq(nc *nats.Conn, stream, subj string) (uint64, error) {
	r, err := nc.Request("$JS.API.DIRECT.GET."+stream, []byte(`{"last_by_subj":"`+subj+`"}`), 5*time.Second)
	if err != nil {
		return 0, err
	}
	if st := r.Header.Get("Status"); st == "404" {
		return 0, nil
	} else if st != "" {
		return 0, fmt.Errorf("direct get %s: %s %s", subj, st, r.Header.Get("Description"))
	}
	return strconv.ParseUint(r.Header.Get("Nats-Sequence"), 10, 64)
}

// protoPuller pulls one message at a time from a durable consumer on an
// inbox of its own, as natssem's waiters do (one pull request outstanding,
// served in the order the server got them).
type protoPuller struct {
	nc    *nats.Conn
	sub   *nats.Subscription
	inbox string
	next  string // the consumer's next-message subject
}

func newPuller(nc *nats.Conn, stream string) (*protoPuller, error) {
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, err
	}
	return &protoPuller{nc: nc, sub: sub, inbox: inbox, next: "$JS.API.CONSUMER.MSG.NEXT." + stream + ".holders"}, nil
}

// pull waits for one delivery; nil when stop closed first.
func (p *protoPuller) pull(stop <-chan struct{}) (*nats.Msg, error) {
	const expires = 500 * time.Millisecond
	req := []byte(`{"batch":1,"expires":` + strconv.FormatInt(int64(expires), 10) + `}`)
	for {
		select {
		case <-stop:
			return nil, nil
		default:
		}
		if err := p.nc.PublishRequest(p.next, p.inbox, req); err != nil {
			return nil, err
		}
		for {
			m, err := p.sub.NextMsg(2 * expires)
			if err != nil {
				return nil, err
			}
			if st := m.Header.Get("Status"); st != "" {
				if st == "100" {
					continue // heartbeat
				}
				break // 408: the pull expired; ask again
			}
			return m, nil
		}
	}
}

// protoHeld is a slot held under one of the protocols.
type protoHeld struct {
	m     *nats.Msg
	idx   int
	claim uint64 // the holder's write (kv, register)
}

// protoOps are one protocol's acquire (turning a delivery into a held slot)
// and release.
type protoOps struct {
	acquire func(nc *nats.Conn, m *nats.Msg, holder []byte) (protoHeld, error)
	release func(nc *nats.Conn, h protoHeld) error
}

func opsOf(p string) protoOps {
	switch p {
	case protoRegister:
		return protoOps{registerAcquire, registerRelease}
	case protoQueue:
		return protoOps{queueAcquire, queueRelease}
	}
	return protoOps{kvAcquire, kvRelease}
}

// kvAcquire is natssem's claim: read the slot's record, take it by
// compare-and-set.
func kvAcquire(nc *nats.Conn, m *nats.Msg, holder []byte) (protoHeld, error) {
	idx, err := strconv.Atoi(string(m.Data))
	if err != nil {
		return protoHeld{}, err
	}
	key := kvSlotKey(idx)
	rev, err := lastSeq(nc, "KV_"+kvBucket, key)
	if err != nil {
		return protoHeld{idx: idx}, err
	}
	claim, err := casPublish(nc, key, key, rev, holder)
	if err != nil {
		_ = m.Nak()
		return protoHeld{idx: idx}, err
	}
	return protoHeld{m: m, idx: idx, claim: claim}, nil
}

// kvRelease frees the record by compare-and-set, then Naks the token.
func kvRelease(nc *nats.Conn, h protoHeld) error {
	key := kvSlotKey(h.idx)
	if _, err := casPublish(nc, key, key, h.claim, []byte(`{}`)); err != nil {
		return err
	}
	return h.m.Nak()
}

func kvSlotKey(idx int) string { return kvSubject("slot." + strconv.Itoa(idx)) }

// kvSubject is the subject of key k of the protocols' bucket.
func kvSubject(k string) string { return "$KV." + kvBucket + "." + k }

// registerAcquire claims the slot at the token's own sequence.
func registerAcquire(nc *nats.Conn, m *nats.Msg, holder []byte) (protoHeld, error) {
	meta, err := m.Metadata()
	if err != nil {
		return protoHeld{}, err
	}
	parts := strings.Split(m.Subject, ".")
	if len(parts) != 3 {
		return protoHeld{}, fmt.Errorf("token subject %q", m.Subject)
	}
	idx, err := strconv.Atoi(parts[1])
	if err != nil {
		return protoHeld{}, err
	}
	claim, err := casPublish(nc, regSubject(idx, "held"), regSubject(idx, "*"), meta.Sequence.Stream, holder)
	if errors.Is(err, errLost) {
		// A stale or duplicate delivery, whose token is not the last word
		// (ack it away), unless the stream's leader says it still is (a
		// refusal while another write was in flight): then hand it on.
		if last, lerr := lastSeqLeader(nc, regStream, regSubject(idx, "*")); lerr == nil && last != meta.Sequence.Stream {
			_ = m.Ack()
		} else {
			_ = m.Nak()
		}
	}
	if err != nil {
		return protoHeld{idx: idx}, err
	}
	return protoHeld{m: m, idx: idx, claim: claim}, nil
}

// lastSeqLeader reads the sequence of the last message on subj from the
// stream's leader (a direct get may come from a replica behind).
func lastSeqLeader(nc *nats.Conn, stream, subj string) (uint64, error) {
	r, err := nc.Request("$JS.API.STREAM.MSG.GET."+stream, []byte(`{"last_by_subj":"`+subj+`"}`), 5*time.Second)
	if err != nil {
		return 0, err
	}
	var resp struct {
		Message *struct {
			Seq uint64 `json:"seq"`
		} `json:"message"`
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(r.Data, &resp); err != nil {
		return 0, err
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return 0, nil
	case resp.Error != nil:
		return 0, resp.Error
	case resp.Message == nil:
		return 0, errors.New("message get: no message")
	}
	return resp.Message.Seq, nil
}

// registerRelease publishes the next token at the claim's sequence, then
// acks the delivery it replaced.
func registerRelease(nc *nats.Conn, h protoHeld) error {
	if _, err := casPublish(nc, regSubject(h.idx, "tok"), regSubject(h.idx, "*"), h.claim, []byte(`{}`)); err != nil {
		return err
	}
	return h.m.Ack()
}

// queueAcquire and queueRelease are no semaphore at all: hold the
// delivery, Nak it. It is the work queue's own handoff, the floor under
// any protocol that returns a token through the consumer (and unsafe:
// nothing fences a stale Nak).
func queueAcquire(_ *nats.Conn, m *nats.Msg, _ []byte) (protoHeld, error) {
	idx, err := strconv.Atoi(string(m.Data))
	return protoHeld{m: m, idx: idx}, err
}

func queueRelease(_ *nats.Conn, h protoHeld) error { return h.m.Nak() }

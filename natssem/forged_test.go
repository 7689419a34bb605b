package natssem_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/driver"
	"github.com/tokensem/tokensem/internal/semtest"
	"github.com/tokensem/tokensem/natssem"
)

// What a user with only a client's rights on a semaphore (pulls, acks,
// direct gets, slot record writes, message deletes) can do to it, written
// from a connection of its own, as such a user would (issue 33, item 3).

// forgedSem is a semaphore under attack: alone, or a key of a group.
type forgedSem struct {
	s                     *natssem.Semaphore
	name, group           string
	bucket, prefix        string // its records' bucket and key prefix
	stream, consumer, sub string
}

func newForgedSem(t *testing.T, name string, grouped bool, permits int, lease time.Duration) forgedSem {
	t.Helper()
	f := forgedSem{name: name, bucket: natssem.ResourcesOf(name, "").Bucket, stream: natssem.ResourcesOf(name, "").Stream, consumer: "holders", sub: natssem.ResourcesOf(name, "").Subject}
	opts := []natssem.Option{natssem.WithLease(lease)}
	if grouped {
		f.group = name + "-g"
		f.bucket, f.prefix = natssem.ResourcesOf("", f.group).Bucket, name+"."
		f.stream, f.consumer, f.sub = natssem.ResourcesOf("", f.group).Stream, "holders_"+name, natssem.ResourcesOf(name, f.group).Subject
		opts = append(opts, natssem.WithGroup(f.group))
	}
	f.s = initNATS(t, name, permits, opts...)
	return f
}

// forge writes slot i's record as the attacker: a plain KV put.
func (f forgedSem) forge(t *testing.T, i int, rec string) {
	t.Helper()
	replaceRecord(t, srv.Addr().String(), f.bucket, fmt.Sprintf("%sslot.%d", f.prefix, i), func([]byte) []byte { return []byte(rec) })
}

// tokenSeqs returns the stream sequence of each slot's token message.
func (f forgedSem) tokenSeqs(t *testing.T) map[int]uint64 {
	t.Helper()
	js, err := jetstream.New(connect(t, srv.Addr().String()))
	if err != nil {
		t.Fatal(err)
	}
	str, err := js.Stream(t.Context(), f.stream)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]uint64{}
	info, err := str.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && seq > 0; seq++ {
		m, err := str.GetMsg(t.Context(), seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if m.Subject != f.sub {
			continue
		}
		tok, err := driver.Codec{}.Decode(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		out[tok.Index] = seq
	}
	return out
}

func (f forgedSem) status(t *testing.T) tokensem.Status {
	t.Helper()
	st, err := f.s.Status(semtest.Context(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func forEachLayout(t *testing.T, test func(t *testing.T, grouped bool)) {
	t.Run("alone", func(t *testing.T) { test(t, false) })
	t.Run("group", func(t *testing.T) { test(t, true) })
}

// TestForgedHolderRecordDeletesNoToken: a held record naming a stream
// sequence that holds no token of its slot is forged (or its token was
// removed): an acquirer that receives the slot's real token must not delete
// it as a duplicate. It steps away while the record is fresh, and takes the
// slot over once the record is a lease old.
func TestForgedHolderRecordDeletesNoToken(t *testing.T) {
	t.Parallel()
	forEachLayout(t, func(t *testing.T, grouped bool) {
		const lease = time.Second
		f := newForgedSem(t, "forged-holder", grouped, 1, lease)
		e := epochOf(t, f.s)
		f.forge(t, 0, fmt.Sprintf(`{"e":%d,"h":"mallory","o":"mallory","seq":999999}`, e))

		if _, err := f.s.Acquire(semtest.Context(t, lease/3)); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Acquire while a fresh forged record holds the slot: %v", err)
		}
		if st := f.status(t); st.Tokens != 1 {
			t.Fatalf("the forged record cost the semaphore its token: %+v", st)
		}
		// Rewritten, it is fresh again: Status names it.
		f.forge(t, 0, fmt.Sprintf(`{"e":%d,"h":"mallory","o":"mallory","seq":999999}`, e))
		if st := f.status(t); st.Healthy || !strings.Contains(strings.Join(st.Warnings, "\n"), "slots [0] are held by records naming no token") {
			t.Errorf("status with a fresh forged record: %+v, want it unhealthy, naming slot 0", st)
		}
		// Not refreshed, the forged record ages out and the slot is taken over.
		p, err := f.s.Acquire(semtest.Context(t, 10*lease))
		if err != nil {
			t.Fatalf("Acquire once the forged record is a lease old: %v", err)
		}
		if err := p.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		if st := f.status(t); st.Tokens != 1 || !st.Healthy {
			t.Fatalf("after the takeover: %+v", st)
		}
	})
}

// TestForgedRecordNamesAnotherSlotsToken: a stale held record of slot 0
// naming the stream sequence of slot 1's token: the claim that takes slot
// 0 over must not delete slot 1's token as the silent holder's copy.
func TestForgedRecordNamesAnotherSlotsToken(t *testing.T) {
	t.Parallel()
	forEachLayout(t, func(t *testing.T, grouped bool) {
		const lease = time.Second
		f := newForgedSem(t, "forged-other", grouped, 2, lease)
		e := epochOf(t, f.s)
		seqs := f.tokenSeqs(t)
		f.forge(t, 0, fmt.Sprintf(`{"e":%d,"h":"mallory","o":"mallory","seq":%d}`, e, seqs[1]))
		time.Sleep(lease + lease/5) // the forged record ages out

		var ps []tokensem.Permit
		for i := range 2 {
			p, err := f.s.Acquire(semtest.Context(t, 3*lease))
			if err != nil {
				t.Fatalf("Acquire %d: %v (status %+v)", i, err, f.status(t))
			}
			ps = append(ps, p)
		}
		if st := f.status(t); st.Tokens != 2 || len(st.Missing) != 0 || st.Held != 2 {
			t.Fatalf("with both permits held: %+v", st)
		}
		for _, p := range ps {
			if err := p.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// TestForgedDeleteMark: a slot record marked deleted while the
// configuration says nothing of a Delete is junk: Status names it, and a
// claim writes it over instead of waiting for a Delete that never comes.
func TestForgedDeleteMark(t *testing.T) {
	forEachLayout(t, func(t *testing.T, grouped bool) {
		const lease = time.Second
		f := newForgedSem(t, "forged-del", grouped, 1, lease)
		e := epochOf(t, f.s)
		for _, rec := range []string{
			fmt.Sprintf(`{"e":%d,"del":true}`, e),
			fmt.Sprintf(`{"e":%d,"seq":1,"by":"ffffffffffffffffffffffffffffffff","del":true}`, e),
			`{"del":true}`,
		} {
			f.forge(t, 0, rec)
			st := f.status(t)
			if !strings.Contains(strings.Join(st.Warnings, "\n"), "marked deleted") {
				t.Errorf("status with slot record %s: warnings %q, want one naming the delete mark", rec, st.Warnings)
			}
			p, err := f.s.Acquire(semtest.Context(t, 3*lease))
			if err != nil {
				t.Fatalf("Acquire with slot record %s and no Delete running: %v", rec, err)
			}
			if err := p.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		if st := f.status(t); !st.Healthy || len(st.Warnings) != 0 {
			t.Fatalf("after the claims: %+v", st)
		}
	})
}

// ackHeld acks the held token at stream sequence seq as an attacker with
// ack rights does: the server matches an ack by stream sequence alone.
func ackHeld(t *testing.T, f forgedSem, seq uint64) {
	t.Helper()
	nc := connect(t, srv.Addr().String())
	subj := fmt.Sprintf("$JS.ACK.%s.%s.1.%d.1.0.0", f.stream, f.consumer, seq)
	if _, err := nc.Request(subj, []byte("+ACK"), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, 5*time.Second, "the acked token to go", func() bool { return len(f.tokenSeqs(t)) == 0 })
}

// deleteHeld deletes the held token at stream sequence seq as an attacker
// with message-delete rights does (a group's stream keeps acked messages,
// so there a delete, not an ack, removes one).
func deleteHeld(t *testing.T, f forgedSem, seq uint64) {
	t.Helper()
	js, err := jetstream.New(connect(t, srv.Addr().String()))
	if err != nil {
		t.Fatal(err)
	}
	str, err := js.Stream(t.Context(), f.stream)
	if err != nil {
		t.Fatal(err)
	}
	if err := str.DeleteMsg(t.Context(), seq); err != nil {
		t.Fatal(err)
	}
}

// TestAckedHeldToken: someone else's +ACK of a held token removes it from
// the stream (a message delete does the same, also on a group's stream).
// The token does not vanish unseen: Status says so at once (unhealthy,
// naming the slot), and after the release the slot is missing, which a
// reconcile issues again. The holder keeps its permit meanwhile: its
// record still keeps everyone else off the slot (a holder told of a loss
// here would be told wrongly when a shrink's resize or a reconcile removed
// a token just claimed, as TestClusterContention found).
func TestAckedHeldToken(t *testing.T) {
	for _, tc := range []struct {
		name    string
		lease   time.Duration
		wait    bool // for a renewal to notice, rather than release at once
		grouped bool // a key of a group, whose token is deleted, not acked
	}{
		{"release", 30 * time.Second, false, false},
		{"renewal", time.Second, true, false},
		{"group release", 30 * time.Second, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newForgedSem(t, "acked-"+strings.ReplaceAll(tc.name, " ", "-"), tc.grouped, 1, tc.lease)
			p, err := f.s.Acquire(semtest.Context(t, 5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if tc.grouped {
				deleteHeld(t, f, f.tokenSeqs(t)[0])
			} else {
				ackHeld(t, f, f.tokenSeqs(t)[0])
			}
			st := f.status(t)
			if st.Healthy || (len(st.Missing) != 1 && !strings.Contains(strings.Join(st.Warnings, "\n"), "slots [0] are held by records naming no token")) {
				t.Errorf("status with the held token acked away: %+v, want it unhealthy, naming slot 0", st)
			}
			if tc.wait {
				// The holder's record still keeps everyone else off the
				// slot, so its permit stays valid through its renewals.
				select {
				case <-p.Done():
					t.Fatalf("Done closed after the token was acked away: %v", p.Err())
				case <-time.After(3 * tc.lease):
				}
			}
			if err := p.Release(t.Context()); err != nil {
				t.Fatalf("Release of a permit whose token was acked away: %v", err)
			}
			if st := f.status(t); len(st.Missing) != 1 || st.Held != 0 {
				t.Errorf("status after the loss: %+v, want slot 0 missing and free", st)
			}
			r, err := reconcileOnce(t.Context(), f.s)
			if err != nil || r.Issued != 1 || !r.Healthy {
				t.Fatalf("reconcile: %+v, %v", r, err)
			}
			q, err := f.s.Acquire(semtest.Context(t, 5*time.Second))
			if err != nil {
				t.Fatalf("Acquire after the reconcile: %v", err)
			}
			_ = q.Release(t.Context())
		})
	}
}

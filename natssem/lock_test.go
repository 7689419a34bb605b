package natssem

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

// The admin lock: exclusive while its holder renews it, free after unlock,
// and taken over once a holder that died stops renewing it.
func TestAdminLock(t *testing.T) {
	// Not t.Parallel: the renewals of a 900 ms lock must keep pace with
	// the clock, which a quiet CI beside natssem's parallel tests did not
	// (b's 2 s attempt ended before it had read the lock once).
	srv := startServer(t)
	ctx := testContext(t)
	a, err := Init(ctx, dial(t, srv), "lock", 1, WithHolderName("a"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Open(ctx, dial(t, srv), "lock", WithHolderName("b"))
	if err != nil {
		t.Fatal(err)
	}
	a.lockTTL, b.lockTTL = 900*time.Millisecond, 900*time.Millisecond

	unlock, err := lockFor(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	// Held past two TTLs by renewal: b must not get it.
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	_, err = lockFor(short, b)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "held by a") {
		t.Fatalf("lock while a renews it: err = %v, want a deadline naming holder a", err)
	}
	unlock()
	unlockB, err := lockFor(ctx, b)
	if err != nil {
		t.Fatalf("lock after unlock: %v", err)
	}
	unlockB()

	// A holder that died: its record is written once and never renewed.
	dead := lockRecord{Holder: "dead", Owner: "dead"}
	val, _ := json.Marshal(dead)
	if _, _, err := (&lockHold{s: a, me: dead, val: val}).try(ctx); err != nil {
		t.Fatal(err)
	}
	// A try whose answer was lost but whose write landed: trying again
	// finds its own record and holds the lock, rather than waiting for it
	// to expire.
	ghost := &lockHold{s: a, me: dead, val: val}
	if _, _, err := ghost.try(ctx); err != nil {
		t.Fatalf("a second try by the holder of the record: %v", err)
	}
	start := time.Now()
	unlockB, err = lockFor(ctx, b)
	if err != nil {
		t.Fatalf("lock after its holder died: %v", err)
	}
	unlockB()
	if waited := time.Since(start); waited < 500*time.Millisecond {
		t.Fatalf("took over a lock renewed %v ago (ttl %v)", waited, b.lockTTL)
	}
}

// lockFor takes s's admin lock and returns its unlock.
func lockFor(ctx context.Context, s *Semaphore) (func(), error) {
	h, err := s.takeLock(ctx)
	if err != nil {
		return nil, err
	}
	return h.unlock, nil
}

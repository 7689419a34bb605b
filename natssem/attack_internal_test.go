package natssem

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/reconciler"
)

// Attacks that need the package's insides: a child process (this test
// binary, started with attackWorkerEnv) runs one admin step split where a
// process can stall, so that the test can freeze it (SIGSTOP) exactly
// there.

const (
	attackWorkerEnv = "TOKENSEM_ATTACK_WORKER" // the worker's job
	attackURLEnv    = "TOKENSEM_ATTACK_URL"
	attackNameEnv   = "TOKENSEM_ATTACK_NAME"
	attackTTLEnv    = "TOKENSEM_ATTACK_LOCK_TTL_MS"
	// attackLocked is what the worker prints once it holds the admin lock;
	// it then stalls attackStall before its next step.
	attackLocked = "LOCKED"
	attackStall  = time.Second
)

func init() {
	switch os.Getenv(attackWorkerEnv) {
	case "stalled-delete":
		os.Exit(stalledDeleteWorker())
	case "acquire-hang":
		os.Exit(acquireHangWorker())
	case "stalled-reconcile":
		os.Exit(stalledReconcileWorker())
	}
}

// acquireHangWorker opens the semaphore, acquires a permit, prints
// "HELD <index> <fence>" and waits to be killed.
func acquireHangWorker() int {
	nc, err := nats.Connect(os.Getenv(attackURLEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := Open(ctx, nc, os.Getenv(attackNameEnv), WithHolderName("dying-holder"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	p, err := s.Acquire(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	fmt.Printf("HELD %d %d\n", p.Token().Index, p.Fence())
	<-ctx.Done()
	return 0
}

// stalledDeleteWorker is Delete (not forced) of a semaphore of its own, as
// Semaphore.delete runs it, with a stall between taking the admin lock and
// the rest (deleteLocked): the moment a GC pause, a descheduled process or
// a frozen VM can last longer than the lock's TTL. It prints attackLocked
// when it holds the lock and Delete's result at the end.
func stalledDeleteWorker() int {
	nc, err := nats.Connect(os.Getenv(attackURLEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	o, err := newOptions([]Option{WithLogger(log), WithHolderName("stalled-deleter")})
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	s, err := newSemaphore(nc, os.Getenv(attackNameEnv), o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	ms, _ := strconv.Atoi(os.Getenv(attackTTLEnv))
	s.lockTTL = time.Duration(ms) * time.Millisecond
	// Semaphore.delete, for a semaphore of its own whose bucket exists.
	kv, err := s.js.KeyValue(ctx, s.lay.bucket)
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	s.setBucket(kv)
	h, err := s.takeLock(ctx)
	if err != nil {
		fmt.Printf("takeLock: %v\n", err)
		return 0
	}
	fmt.Println(attackLocked)
	time.Sleep(attackStall) // the test freezes the process here
	removed := false
	err = s.deleteLocked(ctx, h, false, &removed)
	h.unlock()
	fmt.Printf("DELETE: %v (removed %v)\n", err, removed)
	return 0
}

// TestAttackDeleteFrozenAfterTakingTheLock: a Delete freezes (SIGSTOP)
// right after it took the admin lock, before it marked anything. Its lock
// expires; another Delete takes the lock over and deletes the semaphore,
// and Init makes a new life, which a client holds. The frozen Delete then
// resumes. A delete that lost its admin lock must change nothing: the new
// life must stay usable (Open works, its configuration says ready) and its
// holder must keep its permit.
func TestAttackDeleteFrozenAfterTakingTheLock(t *testing.T) {
	t.Parallel()
	for _, held := range []bool{true, false} {
		t.Run(map[bool]string{true: "new life held", false: "new life idle"}[held], func(t *testing.T) {
			deleteFrozenAfterTakingTheLock(t, held)
		})
	}
}

func deleteFrozenAfterTakingTheLock(t *testing.T, held bool) {
	const (
		lease   = 2 * time.Second
		lockTTL = 1500 * time.Millisecond
	)
	srv := startServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	name := fmt.Sprintf("attack-frozen-lock-%d", time.Now().UnixNano())
	a, err := Init(ctx, dial(t, srv), name, 1, WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	_ = a.Close()

	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), attackWorkerEnv+"=stalled-delete", attackURLEnv+"="+srv.URL(),
		attackNameEnv+"="+name, attackTTLEnv+"="+strconv.Itoa(int(lockTTL/time.Millisecond)))
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	child.Stderr = &stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	stopped := false
	t.Cleanup(func() {
		if stopped {
			_ = child.Process.Signal(syscall.SIGCONT)
		}
		_ = child.Process.Kill()
		_ = child.Wait()
	})
	select {
	case l := <-lines:
		if l != attackLocked {
			t.Fatalf("the deleter says %q, not %q:\n%s", l, attackLocked, stderr.String())
		}
	case <-ctx.Done():
		t.Fatal("the deleter never took the lock")
	}
	if err := child.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped = true
	frozen := time.Now()

	// Another Delete: it waits out the frozen deleter's lock, takes it over
	// and deletes the semaphore.
	d, err := newSemaphore(dial(t, srv), name, mustOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	d.lockTTL = lockTTL
	removed := false
	if err := d.delete(ctx, false, &removed); err != nil {
		t.Fatalf("the second delete: %v", err)
	}
	t.Logf("the second delete took the lock over and finished %v after the freeze", time.Since(frozen).Round(time.Millisecond))
	b, err := Init(ctx, dial(t, srv), name, 2, WithLease(lease))
	if err != nil {
		t.Fatalf("init of the new life: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	var p *Permit
	if held {
		tp, err := b.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		p = tp.(*Permit)
		t.Cleanup(func() { _ = p.Release(context.WithoutCancel(ctx)) })
	}

	if err := child.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopped = false
	var said []string
	for l := range lines {
		said = append(said, l)
	}
	_ = child.Wait()
	t.Logf("the resumed deleter says %q", said)

	cfg, _, err := b.readConfig(ctx)
	if err != nil {
		t.Fatalf("the new life's configuration: %v", err)
	}
	if cfg.State != stateReady {
		t.Errorf("the resumed deleter, whose lock was taken over, changed the new life: its configuration is %q (was %q)", cfg.State, cfg.Was)
	}
	if o, err := Open(ctx, dial(t, srv), name); err != nil {
		t.Errorf("open of the new life after the deleter resumed: %v", err)
	} else {
		_ = o.Close()
	}
	if p != nil {
		// The holder keeps its permit through a renewal.
		before := p.Deadline()
		for p.Err() == nil && !p.Deadline().After(before) && ctx.Err() == nil {
			time.Sleep(5 * time.Millisecond)
		}
		if err := p.Err(); err != nil {
			t.Errorf("the new life's holder lost its permit after the deleter resumed: %v", err)
		}
	}
	if t.Failed() {
		t.Logf("the deleter's log:\n%s", stderr.String())
	}
}

func mustOptions(t *testing.T, opts ...Option) options {
	t.Helper()
	o, err := newOptions(opts)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// TestAttackUnconfirmedHolderDies: the first claim of a slot in a life
// writes its record Pending; the holder is killed (SIGKILL) before its first
// renewal, so the record stays Pending, naming a holder of the current
// life. Until a lease has passed, Delete must refuse (the holder may be
// alive for all anyone knows) and nobody may take the slot; after it, a
// waiter gets the permit with a greater fence, within about a lease, and
// Delete then succeeds.
func TestAttackUnconfirmedHolderDies(t *testing.T) {
	const lease = 2 * time.Second
	srv := startServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	name := fmt.Sprintf("attack-dying-%d", time.Now().UnixNano())
	a, err := Init(ctx, dial(t, srv), name, 1, WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })

	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), attackWorkerEnv+"=acquire-hang", attackURLEnv+"="+srv.URL(), attackNameEnv+"="+name)
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	child.Stderr = &stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("the holder: %v\n%s", err, stderr.String())
	}
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	var idx int
	var fence uint64
	if _, err := fmt.Sscanf(line, "HELD %d %d", &idx, &fence); err != nil {
		t.Fatalf("the holder said %q: %v", line, err)
	}
	got, err := a.slots.read(ctx, idx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the holder of slot %d (fence %d) was killed; its record: %+v at revision %d", idx, fence, got.rec, got.rev)
	if !got.rec.Pending || got.rev != fence {
		t.Logf("(the record is not the holder's Pending claim: the attack did not set up what it meant to)")
	}

	// Within the lease: Delete refuses.
	if err := Delete(ctx, dial(t, srv), name); !errors.Is(err, tokensem.ErrHeld) {
		t.Errorf("Delete %v after the Pending holder died: %v, want ErrHeld", time.Since(killed).Round(time.Millisecond), err)
	}
	// A waiter: not before the dead holder's last belief, within about a lease.
	b, err := Open(ctx, dial(t, srv), name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	tp, err := b.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(killed)
	p := tp.(*Permit)
	t.Logf("a waiter got slot %d (fence %d) %v after the kill", p.Token().Index, p.Fence(), took.Round(time.Millisecond))
	if p.Fence() <= fence {
		t.Errorf("the waiter's fence %d is not above the dead holder's %d", p.Fence(), fence)
	}
	if took < lease-lease/5 {
		t.Errorf("the waiter got the slot %v after the kill, before the dead holder's belief could have ended (%v)", took, lease-lease/5)
	}
	if took > 2*lease+time.Second {
		t.Errorf("the waiter got the slot only %v after the kill (lease %v)", took, lease)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := Delete(ctx, dial(t, srv), name); err != nil {
		t.Errorf("Delete after the slot was taken over and released: %v", err)
	}
}

// preLocked is an Inventory whose Lock hands out a lock taken already.
type preLocked struct {
	*Inventory
	unlock func()
}

func (p preLocked) Lock(context.Context) (func(), error) { return p.unlock, nil }

// stalledReconcileWorker is a reconcile with repair (reconciler.Run without
// the gate), with a stall between taking the admin lock and the census. It
// prints attackLocked when it holds the lock and the run's result at the end.
func stalledReconcileWorker() int {
	nc, err := nats.Connect(os.Getenv(attackURLEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s, err := Open(ctx, nc, os.Getenv(attackNameEnv), WithLogger(log), WithHolderName("stalled-reconciler"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	ms, _ := strconv.Atoi(os.Getenv(attackTTLEnv))
	s.lockTTL = time.Duration(ms) * time.Millisecond
	inv := s.Inventory()
	unlock, err := inv.Lock(ctx)
	if err != nil {
		fmt.Printf("lock: %v\n", err)
		return 0
	}
	fmt.Println(attackLocked)
	time.Sleep(attackStall) // the test freezes the process here
	r, err := reconciler.RunWithoutGate(ctx, preLocked{inv, unlock}, true)
	fmt.Printf("RECONCILE: removed %d issued %d healthy %v err %v\n", r.Removed, r.Issued, r.Healthy, err)
	return 0
}

// startWorker starts this test binary as worker job with the given
// environment, and returns it with its stdout lines.
func startWorker(t *testing.T, job string, env ...string) (*exec.Cmd, <-chan string, *strings.Builder) {
	t.Helper()
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(append(os.Environ(), attackWorkerEnv+"="+job), env...)
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &strings.Builder{}
	child.Stderr = stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	t.Cleanup(func() {
		_ = child.Process.Signal(syscall.SIGCONT)
		_ = child.Process.Kill()
		_ = child.Wait()
	})
	return child, lines, stderr
}

// TestAttackReconcileFrozenAfterTakingTheLock: a reconcile with repair
// freezes (SIGSTOP) right after it took the admin lock. Its lock expires; a
// Delete takes it over and deletes the semaphore, and Init makes a new life
// of two permits, which a client holds; the new life is then damaged by
// hand (a token removed, a junk message added), so that a repair would
// have work. The frozen reconcile resumes: it must repair nothing (its lock
// was taken over), and a reconcile of the new life then repairs it.
func TestAttackReconcileFrozenAfterTakingTheLock(t *testing.T) {
	t.Parallel()
	const (
		lease   = 2 * time.Second
		lockTTL = 1500 * time.Millisecond
	)
	srv := startServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	name := fmt.Sprintf("attack-frozen-reconcile-%d", time.Now().UnixNano())
	a, err := Init(ctx, dial(t, srv), name, 2, WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	_ = a.Close()
	child, lines, stderr := startWorker(t, "stalled-reconcile", attackURLEnv+"="+srv.URL(), attackNameEnv+"="+name,
		attackTTLEnv+"="+strconv.Itoa(int(lockTTL/time.Millisecond)))
	select {
	case l := <-lines:
		if l != attackLocked {
			t.Fatalf("the reconciler says %q, not %q:\n%s", l, attackLocked, stderr.String())
		}
	case <-ctx.Done():
		t.Fatal("the reconciler never took the lock")
	}
	if err := child.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}

	d, err := newSemaphore(dial(t, srv), name, mustOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	d.lockTTL = lockTTL
	removed := false
	if err := d.delete(ctx, false, &removed); err != nil {
		t.Fatalf("the delete: %v", err)
	}
	b, err := Init(ctx, dial(t, srv), name, 2, WithLease(lease))
	if err != nil {
		t.Fatalf("init of the new life: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	tp, err := b.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p := tp.(*Permit)
	t.Cleanup(func() { _ = p.Release(context.WithoutCancel(ctx)) })
	// Damage: the ready token removed, junk added.
	msgs, err := b.scanTokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		if m.Seq != p.d.seq {
			if err := b.deleteMsg(ctx, m.Seq); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := dial(t, srv).Publish(b.lay.subject, []byte("junk")); err != nil {
		t.Fatal(err)
	}
	before, err := b.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}

	if err := child.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	var said []string
	for l := range lines {
		said = append(said, l)
	}
	t.Logf("the resumed reconciler says %q", said)
	after, err := b.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after.Tokens != before.Tokens || after.Invalid != before.Invalid || len(after.Missing) != len(before.Missing) {
		t.Errorf("the resumed reconciler, whose lock was taken over, changed the new life: before %+v, after %+v", before, after)
	}
	if err := p.Err(); err != nil {
		t.Errorf("the new life's holder lost its permit: %v", err)
	}
	r, err := reconciler.Run(ctx, b.Inventory(), true)
	if err != nil || !r.Healthy {
		t.Errorf("a reconcile of the new life: %+v, %v", r, err)
	}
	if t.Failed() {
		t.Logf("the reconciler's log:\n%s", stderr.String())
	}
}

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

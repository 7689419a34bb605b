package main

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokensem/tokensem/natssem"
	"github.com/tokensem/tokensem/natssem/embedded"
)

const (
	name    = "fleet"
	permits = 3
	workers = 10
	lease   = 2 * time.Second
	runFor  = 10 * time.Second
	killAt  = 3 * time.Second
)

func main() {
	if len(os.Args) == 3 && os.Args[1] == "worker" {
		os.Exit(worker(os.Args[2]))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "fleet:", err)
		os.Exit(1)
	}
}

// fleet is the parent's view of its workers.
type fleet struct {
	mu       sync.Mutex
	holding  map[int]int // worker -> slot
	max      int
	total    int
	killed   int // worker killed, -1 before
	killSlot int
	killTime time.Time
	backIn   time.Duration
}

func run(ctx context.Context) error {
	srv, err := embedded.Start(embedded.Config{})
	if err != nil {
		return err
	}
	defer srv.Shutdown()
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		return err
	}
	defer nc.Close()
	sem, err := natssem.Init(ctx, nc, name, permits, natssem.WithLease(lease))
	if err != nil {
		return err
	}
	defer sem.Close()
	fmt.Printf("embedded NATS at %s; semaphore %q: %d permits, lease %v; %d worker processes\n\n",
		srv.URL(), name, permits, lease, workers)

	self, err := os.Executable()
	if err != nil {
		return err
	}
	f := &fleet{holding: map[int]int{}, killed: -1}
	procs := make([]*exec.Cmd, workers)
	var wg sync.WaitGroup
	for i := range procs {
		cmd := exec.Command(self, "worker", srv.URL())
		in, _ := cmd.StdinPipe()
		out, _ := cmd.StdoutPipe()
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			return err
		}
		procs[i] = cmd
		wg.Go(func() { f.serve(i, out, in) })
	}
	defer func() {
		for _, p := range procs {
			_ = p.Process.Signal(syscall.SIGTERM)
		}
		for _, p := range procs {
			_ = p.Wait()
		}
		wg.Wait()
	}()

	start := time.Now()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for time.Since(start) < runFor {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		if time.Since(start) >= killAt && f.killVictim(procs) {
			continue
		}
		f.print(time.Since(start))
	}
	st, err := sem.Status(ctx)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	fmt.Printf("\n%d acquisitions; most holders at once: %d of %d permits\n", f.total, f.max, permits)
	switch {
	case f.killed < 0:
		return fmt.Errorf("no holder was killed")
	case f.backIn == 0:
		return fmt.Errorf("the killed holder's slot %d did not come back", f.killSlot)
	}
	fmt.Printf("killed worker %d while it held slot %d; the slot was held again %v later (lease %v)\n",
		f.killed, f.killSlot, f.backIn.Round(time.Millisecond), lease)
	fmt.Printf("status: %d tokens for %d permits, healthy=%v\n", st.Tokens, st.Permits, st.Healthy)
	if f.max > permits {
		return fmt.Errorf("SAFETY VIOLATION: %d holders of %d permits", f.max, permits)
	}
	return nil
}

// serve reads one worker's reports and acknowledges each.
func (f *fleet) serve(id int, out interface{ Read([]byte) (int, error) }, in interface{ Write([]byte) (int, error) }) {
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		slot, _ := strconv.Atoi(fields[1])
		f.mu.Lock()
		switch fields[0] {
		case "enter":
			f.holding[id] = slot
			f.total++
			f.max = max(f.max, len(f.holding))
			if f.killed >= 0 && f.backIn == 0 && slot == f.killSlot {
				f.backIn = time.Since(f.killTime)
				fmt.Printf("        slot %d is back: worker %d holds it, %v after the kill\n", slot, id, f.backIn.Round(time.Millisecond))
			}
		case "leave":
			delete(f.holding, id)
		}
		f.mu.Unlock()
		_, _ = in.Write([]byte("ok\n"))
	}
	f.mu.Lock()
	delete(f.holding, id)
	f.mu.Unlock()
}

// killVictim SIGKILLs one current holder, once.
func (f *fleet) killVictim(procs []*exec.Cmd) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.killed >= 0 {
		return false
	}
	for id, slot := range f.holding {
		_ = procs[id].Process.Kill()
		f.killed, f.killSlot, f.killTime = id, slot, time.Now()
		delete(f.holding, id)
		fmt.Printf("        SIGKILL worker %d while it holds slot %d\n", id, slot)
		return true
	}
	return false
}

func (f *fleet) print(at time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	slots := make([]string, 0, len(f.holding))
	for id, slot := range f.holding {
		slots = append(slots, fmt.Sprintf("w%d:slot%d", id, slot))
	}
	fmt.Printf("t=%4.1fs holders %d/%d %-36s max so far %d\n", at.Seconds(), len(f.holding), permits, strings.Join(slots, " "), f.max)
}

// worker acquires, works 100-400ms, releases, forever.
func worker(url string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	nc, err := nats.Connect(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	defer nc.Close()
	sem, err := natssem.Open(ctx, nc, name)
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	defer sem.Close()
	acks := bufio.NewScanner(os.Stdin)
	report := func(what string, slot int) bool {
		fmt.Printf("%s %d\n", what, slot)
		return acks.Scan()
	}
	for ctx.Err() == nil {
		p, err := sem.Acquire(ctx)
		if err != nil {
			return 0
		}
		if !report("enter", p.Token().Index) {
			return 0
		}
		select {
		case <-time.After(time.Duration(100+rand.IntN(300)) * time.Millisecond):
		case <-p.Done(): // lost: stop using the resource at once
		case <-ctx.Done():
		}
		if !report("leave", p.Token().Index) {
			return 0
		}
		_ = p.Release(context.Background())
	}
	return 0
}

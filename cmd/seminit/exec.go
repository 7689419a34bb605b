package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/redact"
)

// runExec acquires a permit, runs a command while holding it (see child),
// releases it and exits with the command's status. If the permit is lost,
// or --max-hold runs out, the command's process group gets SIGTERM, then
// SIGKILL after --kill-after. SIGINT, SIGTERM, SIGHUP and SIGQUIT to
// seminit are passed on to the command as themselves.
func runExec(ctx context.Context, e env, args []string) error {
	fs := flag.NewFlagSet("exec", flag.ContinueOnError)
	var g globals
	g.register(fs)
	var names nameList
	fs.Var(&names, "name", "semaphore name; give it more than once to hold one permit of each (taken in one order, whatever order they are given in)")
	weight := fs.Int("weight", 1, "hold K permits of the semaphore at once, all or nothing")
	priority := fs.Int("priority", 0, fmt.Sprintf("wait in class P (%d to %d): a freed permit goes to the highest class waiting, in arrival order within one", tokensem.LowestPriority, tokensem.HighestPriority))
	wait := fs.Duration("wait", 0, "give up (exit 75) if no permit comes within DUR; 0 tries once, as flock -w 0 (default: wait indefinitely)")
	hold := fs.Duration("max-hold", 0, "hold the permit at most DUR: then stop the command and exit 124 (default: no limit)")
	lease := fs.Duration("lease", 0, "the lease you expect; the semaphore's stored lease (set by init) governs, and a different value is reported")
	killAfter := fs.Duration("kill-after", 10*time.Second, "after SIGTERM, SIGKILL the command if it has not exited within DUR")
	passCreds := fs.Bool("pass-credentials", false, "hand the command $TOKENSEM_URL whole and $TOKENSEM_PASSWORD, $TOKENSEM_TOKEN and $TOKENSEM_KEY (default: the URL without its credentials and none of the others)")
	initPermits := fs.Int("init-permits", 0, "create each semaphore with N permits if it does not exist yet, as init does (a different count is a mismatch, exit 78)")
	conflict := fs.Int("conflict-exit-code", exitNoPermit, "exit with N when no permit comes within --wait (or too many wait), as flock -E: pick one your command never uses")
	if err := parse(fs, args, true); err != nil {
		return err
	}
	if len(names) == 0 {
		return requireName("")
	}
	for i, n := range names {
		if err := requireName(n); err != nil {
			return err
		}
		if slices.Contains(names[:i], n) {
			return usageErr{fmt.Errorf("--name %s is given twice: give each semaphore once (--weight K holds K permits of one)", n)}
		}
	}
	argv := fs.Args()
	if len(argv) == 0 {
		return usageErr{errors.New("no command given (seminit exec --name NAME -- CMD [ARGS...])")}
	}
	if *weight < 1 {
		return usageErr{fmt.Errorf("--weight %d: want at least 1", *weight)}
	}
	if *weight > 1 && len(names) > 1 {
		return usageErr{errors.New("--weight above 1 takes one --name")}
	}
	if *wait < 0 || *hold < 0 || *lease < 0 || *killAfter <= 0 {
		return usageErr{errors.New("--wait, --lease and --max-hold must not be negative, --kill-after must be positive")}
	}
	// 0 would silently mean no limit, no check: say so instead.
	if isSet(fs, "max-hold") && *hold == 0 {
		return usageErr{errors.New("--max-hold 0: want a positive duration (leave --max-hold out for no limit)")}
	}
	if isSet(fs, "lease") && *lease == 0 {
		return usageErr{errors.New("--lease 0: want a positive duration (leave --lease out to take the semaphore's)")}
	}
	if p := tokensem.Priority(*priority); p < tokensem.LowestPriority || p > tokensem.HighestPriority {
		return usageErr{fmt.Errorf("--priority %d: want a class from %d (lowest) to %d (highest); 0 is the default", p, tokensem.LowestPriority, tokensem.HighestPriority)}
	}
	ctx = tokensem.WithPriority(ctx, tokensem.Priority(*priority))
	if *conflict < 0 || *conflict > 255 {
		return usageErr{fmt.Errorf("--conflict-exit-code %d is not an exit code (0..255)", *conflict)}
	}
	if isSet(fs, "init-permits") {
		if err := tokensem.ValidatePermits(*initPermits); err != nil {
			return usageErr{fmt.Errorf("--init-permits: %w", err)}
		}
	}
	sems, done, err := openOrInit(ctx, &g, names, *initPermits, *lease)
	if err != nil {
		return err
	}
	defer done()
	for i, s := range sems {
		if l, ok := s.(interface{ Lease() time.Duration }); ok && *lease != 0 && l.Lease() != *lease {
			e.warnf("seminit exec: %s has a lease of %v (set by init); --lease %v does not change it\n", names[i], l.Lease(), *lease)
		}
	}

	var p *tokensem.PermitSet
	waited := false // the wait, not a broker request, ran out
	what := names.String()
	if *weight > 1 {
		what = fmt.Sprintf("%d permits of %s", *weight, what)
	}
	if isSet(fs, "wait") && *wait == 0 {
		// Try once: the broker round trips are bounded by the request
		// timeout, not by a wait.
		p, err = take(ctx, sems, *weight, true)
	} else {
		actx, cancel := ctx, context.CancelFunc(func() {})
		if *wait > 0 {
			actx, cancel = context.WithTimeout(ctx, *wait)
		}
		waitWhat := "a permit of " + what
		switch {
		case *weight > 1:
			waitWhat = what
		case len(names) > 1:
			waitWhat = "a permit of each of " + what
		}
		stop := g.reporter(e).every(actx, waitLine(waitWhat, sems, g.timeout))
		p, err = take(actx, sems, *weight, false)
		stop()
		waited = actx.Err() != nil
		cancel()
	}
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return exitCodeErr{code: signalExit(ctx), err: errors.New("interrupted while waiting for a permit")}
	case errors.Is(err, tokensem.ErrWeightExceedsPermits), errors.Is(err, tokensem.ErrAmbiguousOrder):
		return usageErr{err}
	case errors.Is(err, tokensem.ErrNoPermit):
		return exitCodeErr{code: *conflict, err: fmt.Errorf("no permit of %s free now (--wait 0)", what)}
	case waited && errors.Is(err, context.DeadlineExceeded):
		return exitCodeErr{code: *conflict, err: fmt.Errorf("no permit of %s within %v", what, *wait)}
	case errors.Is(err, tokensem.ErrTooManyWaiters):
		return exitCodeErr{code: *conflict, err: err}
	default:
		return classify(err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.Background(), tokensem.ReleaseTimeout)
		defer cancel()
		if err := p.Release(rctx); err != nil && !errors.Is(err, tokensem.ErrReleased) && !errors.Is(err, tokensem.ErrLeaseLost) {
			e.warnf("seminit exec: release: %v\n", err)
		}
	}()

	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, e.stdout, e.stderr
	env := os.Environ()
	if !*passCreds {
		env = childEnv(env)
	}
	cmd.Env = append(env, permitEnv(p)...)
	if ctx.Err() != nil {
		return exitCodeErr{code: signalExit(ctx), err: errors.New("interrupted before the command started")}
	}
	c, err := startChild(cmd)
	if err != nil {
		return exitCodeErr{code: 127, err: fmt.Errorf("start %s: %w", argv[0], err)}
	}
	// From here on, stop signals go to the command as themselves; seminit
	// exits when it does. One that came just before is passed on now.
	defer e.signals.route(c.signal)()
	var se signalErr
	if errors.As(context.Cause(ctx), &se) {
		c.signal(se.sig)
	}

	var holdC <-chan time.Time
	if *hold > 0 {
		t := time.NewTimer(*hold)
		defer t.Stop()
		holdC = t.C
	}
	select {
	case err := <-c.exited:
		return childExit(err)
	case <-p.Done():
		_ = stopChild(c, *killAfter)
		return exitCodeErr{code: exitSoftware, err: fmt.Errorf("command stopped: %v", p.Err())}
	case <-holdC:
		_ = stopChild(c, *killAfter)
		return exitCodeErr{code: exitHoldLimit, err: fmt.Errorf("held the permit for --max-hold %v, command stopped", *hold)}
	}
}

// take acquires what exec holds: one permit of sems[0], weight permits of
// it, or one permit of each of sems; try: without waiting.
func take(ctx context.Context, sems []tokensem.Semaphore, weight int, try bool) (*tokensem.PermitSet, error) {
	switch {
	case len(sems) > 1 && try:
		return tokensem.TryAcquireAll(ctx, sems...)
	case len(sems) > 1:
		return tokensem.AcquireAll(ctx, sems...)
	}
	w, ok := sems[0].(tokensem.Weighted)
	if !ok {
		return nil, fmt.Errorf("%w: %T cannot hold several permits", tokensem.ErrInvalidOption, sems[0])
	}
	if try {
		return w.TryAcquireN(ctx, weight)
	}
	return w.AcquireN(ctx, weight)
}

// permitEnv is the environment that tells the command what it holds:
// TOKENSEM_NAME, TOKENSEM_SLOT and TOKENSEM_FENCE of the first permit, and
// TOKENSEM_NAMES, TOKENSEM_SLOTS and TOKENSEM_FENCES listing every permit,
// comma-separated, in one order.
func permitEnv(p *tokensem.PermitSet) []string {
	toks, fences := p.Tokens(), p.Fences()
	names, slots, fs := make([]string, len(toks)), make([]string, len(toks)), make([]string, len(toks))
	for i, t := range toks {
		names[i], slots[i], fs[i] = t.Semaphore, strconv.Itoa(t.Index), strconv.FormatUint(fences[i], 10)
	}
	return []string{
		"TOKENSEM_NAME=" + names[0], "TOKENSEM_SLOT=" + slots[0], "TOKENSEM_FENCE=" + fs[0],
		"TOKENSEM_NAMES=" + strings.Join(names, ","),
		"TOKENSEM_SLOTS=" + strings.Join(slots, ","),
		"TOKENSEM_FENCES=" + strings.Join(fs, ","),
	}
}

// nameList is a flag given once per semaphore name.
type nameList []string

func (l *nameList) String() string { return strings.Join(*l, ",") }

func (l *nameList) Set(v string) error {
	*l = append(*l, v)
	return nil
}

// secretEnv are the variables that carry broker credentials or the signing
// key: seminit read them, the command it runs does not get them (unless
// --pass-credentials).
var secretEnv = []string{"TOKENSEM_PASSWORD", "TOKENSEM_TOKEN", "TOKENSEM_KEY"}

// childEnv is env without the secrets, and with $TOKENSEM_URL's
// credentials removed (redact.Strip): the command learns which broker, not
// how to log in to it.
func childEnv(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		name, v, _ := strings.Cut(kv, "=")
		switch {
		case slices.Contains(secretEnv, name):
		case name == "TOKENSEM_URL":
			out = append(out, name+"="+redact.Strip(v))
		default:
			out = append(out, kv)
		}
	}
	return out
}

package natssem

import (
	"context"
	"errors"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"time"
	"weak"

	"github.com/nats-io/nats.go"
)

// A NATS server refuses a publish or a subscription the user's permissions
// do not allow with an asynchronous -ERR ('Permissions Violation for
// Publish to "SUBJECT"') and drops it: a request then waits for an answer
// that never comes. nats.go tells of the refusal only through the
// connection's error handler (and LastError), as an error wrapping
// nats.ErrPermissionViolation whose text alone names the subject.
//
// So natssem puts a watcher in front of the connection's error handler,
// once per connection (the handler it replaces is still called). Each
// round trip and each wait of a Semaphore is guarded: a refusal of one of
// the semaphore's subjects, or of a subscription to the connection's
// inboxes, ends the guarded ones in flight at once with a permissionError,
// which wraps tokensem.ErrPermissionDenied and is never retried. A handler
// the caller sets on the connection afterwards replaces the watcher; the
// refusal then shows as a timeout, as in nats.go.

// refusal is a publish or subscription the broker refused.
type refusal struct {
	op      string // "publish" or "subscribe"
	subject string
	err     error // nats.go's, wrapping nats.ErrPermissionViolation
	at      time.Time
}

// violationRE matches the text of a permissions violation as the server
// writes it (server/client.go: pubPermissionViolation and
// subPermissionViolation). nats.go keeps no more than this text: it parses
// the subscription case the same way.
var violationRE = regexp.MustCompile(`(?i)permissions violation for (publish|subscription) to "([^"]+)"`)

// parseRefusal reads the refused operation and subject from an error the
// connection reported, if it is a permissions violation.
func parseRefusal(err error) (refusal, bool) {
	if !errors.Is(err, nats.ErrPermissionViolation) {
		return refusal{}, false
	}
	m := violationRE.FindStringSubmatch(err.Error())
	if m == nil {
		return refusal{}, false
	}
	op := "publish"
	if strings.EqualFold(m[1], "subscription") {
		op = "subscribe"
	}
	return refusal{op: op, subject: m[2], err: err, at: time.Now()}, true
}

// recentRefusals is how many refusals a watcher remembers for refusedSince.
const recentRefusals = 16

// watcher hears the refusals of one connection.
type watcher struct {
	inbox string // the connection's inbox prefix, with its trailing '.'

	mu     sync.Mutex
	guards map[*guarded]struct{} // in flight
	recent []refusal             // the last recentRefusals, oldest first
}

// watchers holds the watcher of each connection a Semaphore uses, for as
// long as the connection lives: its error handler keeps calling it.
var watchers = struct {
	sync.Mutex
	m map[weak.Pointer[nats.Conn]]*watcher
}{m: map[weak.Pointer[nats.Conn]]*watcher{}}

// watch returns the watcher of nc, putting one in front of its error
// handler the first time.
func watch(nc *nats.Conn) *watcher {
	key := weak.Make(nc)
	watchers.Lock()
	defer watchers.Unlock()
	if w := watchers.m[key]; w != nil {
		return w
	}
	inbox := nc.NewInbox()
	w := &watcher{inbox: inbox[:strings.LastIndexByte(inbox, '.')+1], guards: map[*guarded]struct{}{}}
	prev := nc.ErrorHandler()
	nc.SetErrorHandler(func(c *nats.Conn, sub *nats.Subscription, err error) {
		// The connection's own handler first: the calls note ends may
		// end the program, and what that handler logs must come before.
		if prev != nil {
			prev(c, sub, err)
		}
		w.note(err)
	})
	watchers.m[key] = w
	runtime.AddCleanup(nc, func(key weak.Pointer[nats.Conn]) {
		watchers.Lock()
		defer watchers.Unlock()
		delete(watchers.m, key)
	}, key)
	return w
}

// note ends the guarded calls that a refusal in err concerns.
func (w *watcher) note(err error) {
	r, ok := parseRefusal(err)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.recent) == recentRefusals {
		w.recent = append(w.recent[:0], w.recent[1:]...)
	}
	w.recent = append(w.recent, r)
	for g := range w.guards {
		if w.concerns(r, g.s) {
			g.deny(refused(g.s.name, r))
		}
	}
}

// concerns reports whether refusal r is about semaphore s: a subject of
// its own, or a subscription to the connection's inboxes, which every
// request and wait needs.
func (w *watcher) concerns(r refusal, s *Semaphore) bool {
	if r.op == "subscribe" {
		return strings.HasPrefix(r.subject, w.inbox)
	}
	if s.name == "" && !s.lay.grouped() { // List
		return r.subject == "$JS.API.STREAM.NAMES" || r.subject == "$JS.API.STREAM.LIST" ||
			strings.Contains(r.subject, ".KV_"+bucketPrefix) || strings.HasPrefix(r.subject, "$KV."+bucketPrefix)
	}
	return s.lay.names(r.subject)
}

// refusedSince returns the error of a refusal about s heard at or after
// since, or nil: for a request that was not guarded and timed out.
func (w *watcher) refusedSince(since time.Time, s *Semaphore) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := len(w.recent) - 1; i >= 0 && !w.recent[i].at.Before(since); i-- {
		if w.concerns(w.recent[i], s) {
			return refused(s.name, w.recent[i])
		}
	}
	return nil
}

// guard returns a context derived from ctx (with the timeout d, if d > 0)
// that also ends when the broker refuses a subject of s; its Err is then
// a permissionError. stop releases it.
func (w *watcher) guard(ctx context.Context, s *Semaphore, d time.Duration) (_ context.Context, stop context.CancelFunc) {
	var inner context.Context
	var cancel context.CancelFunc
	if d > 0 {
		inner, cancel = context.WithTimeout(ctx, d)
	} else {
		inner, cancel = context.WithCancel(ctx)
	}
	g := &guarded{Context: inner, cancel: cancel, s: s}
	w.mu.Lock()
	w.guards[g] = struct{}{}
	w.mu.Unlock()
	return g, func() {
		w.mu.Lock()
		delete(w.guards, g)
		w.mu.Unlock()
		cancel()
	}
}

// guarded is a context that a refusal ends (see watcher.guard). Contexts
// derived from it end with it, but their Err is context.Canceled: the
// requests that matter wait on a guarded context itself.
type guarded struct {
	context.Context // a cancelCtx: Done, Deadline and Value are its own
	cancel          context.CancelFunc
	s               *Semaphore

	mu  sync.Mutex
	err error // the refusal that ended it
}

func (g *guarded) Err() error {
	err := g.Context.Err()
	if err == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err != nil {
		return g.err
	}
	return err
}

// deny ends g with err, unless it has ended already.
func (g *guarded) deny(err error) {
	g.mu.Lock()
	if g.err == nil && g.Context.Err() == nil {
		g.err = err
	}
	g.mu.Unlock()
	g.cancel()
}

// names reports whether subject (one the broker refused) is one of the
// semaphore's: of its stream, consumer, bucket or tokens. A group's
// stream and bucket as a whole are every key's, a consumer or record of
// another key of the group is not.
func (l layout) names(subject string) bool {
	if subject == l.subject {
		return true
	}
	toks := strings.Split(subject, ".")
	for i, t := range toks {
		if t != l.stream && t != l.kvStream() && t != l.bucket {
			continue
		}
		if !l.grouped() {
			return true
		}
		for j := i; j < len(toks); j++ {
			switch {
			case strings.HasPrefix(toks[j], groupConsumerPrefix):
				return toks[j] == l.consumer
			case toks[j] == l.bucket && j+1 < len(toks):
				k := toks[j+1]
				return k+"." == l.prefix || k == "*" || k == ">" || k == generationKey
			}
		}
		return true // the group's stream or bucket as a whole
	}
	return false
}

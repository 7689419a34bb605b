package main

import (
	"context"

	"github.com/tokensem/tokensem"
)

// A System is one semaphore implementation on its broker, driven the same
// way by every scenario.
type System interface {
	// Key is the short name used by -systems ("natssem", "amqpsem", ...).
	Key() string
	// Label names the system in tables and plots.
	Label() string
	// Connect opens a new client connection (a process of its own, as far
	// as the broker can tell).
	Connect(ctx context.Context) (Client, error)
	// Waiting reports how many callers wait for a permit of name, as the
	// server counts them (the Redis semaphore has no server-side queue: its
	// clients count the callers that failed once and sleep before retrying).
	// It must be cheap and must not disturb the semaphore.
	Waiting(ctx context.Context, name string) (int, error)
	// WaitersPerClient is how many callers one client connection can keep
	// waiting at once (0: no limit of its own).
	WaitersPerClient() int
	// Cleanup removes what the semaphore name left on the broker, best effort.
	Cleanup(ctx context.Context, name string)
	// Close stops the system's own connections and servers.
	Close()
}

// Client is one connection to a system's broker.
type Client interface {
	// Init creates semaphore name with n permits (maxWaiters: room for at
	// least that many waiting callers where the backend has such a limit).
	Init(ctx context.Context, name string, n, maxWaiters int) (Sem, error)
	// Open opens an existing semaphore.
	Open(ctx context.Context, name string) (Sem, error)
	Close() error
}

// Sem is one client's handle on one semaphore.
type Sem interface {
	Acquire(ctx context.Context) (Held, error)
	Status(ctx context.Context) (Census, error)
	Close() error
}

// Held is a held permit.
type Held interface {
	Release(ctx context.Context) error
}

// Census is the part of a status the harness checks.
type Census struct {
	Permits, Tokens, Available, Held, Waiting int
	Healthy                                   bool
}

// tokenSem adapts a tokensem.Semaphore. onHold, if set, sees every permit
// it hands out (amqpsem records the slots it must clean up).
type tokenSem struct {
	s      tokensem.Semaphore
	onHold func(tokensem.Permit)
}

func (t tokenSem) Acquire(ctx context.Context) (Held, error) {
	p, err := t.s.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	if t.onHold != nil {
		t.onHold(p)
	}
	return p, nil
}

func (t tokenSem) Status(ctx context.Context) (Census, error) {
	st, err := t.s.Status(ctx)
	if err != nil {
		return Census{}, err
	}
	return Census{Permits: st.Permits, Tokens: st.Tokens, Available: st.Available, Held: st.Held,
		Waiting: st.Waiting, Healthy: st.Healthy}, nil
}

func (t tokenSem) Close() error { return t.s.Close() }

// slotOf returns the token index of a tokensem permit, or -1.
func slotOf(h Held) int {
	if p, ok := h.(interface{ Token() tokensem.Token }); ok {
		return p.Token().Index
	}
	return -1
}

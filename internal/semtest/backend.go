package semtest

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/driver"
)

// Backend adapts one broker to the suite. Every function opens its own
// broker connection to addr (the broker's own address, or a fault proxy in
// front of it) and closes it in a t.Cleanup, so that each client in a test
// is a separate broker session, as separate processes would be.
type Backend struct {
	// Name is "nats" or "amqp".
	Name string
	// Addr is the broker's host:port.
	Addr string
	// Init creates (or opens) semaphore name with permits.
	Init func(t testing.TB, addr, name string, permits int, o Options) (tokensem.Semaphore, error)
	// Open opens an existing semaphore by name.
	Open func(t testing.TB, addr, name string, o Options) (tokensem.Semaphore, error)
	// InjectRaw puts data straight into the semaphore's token store, as an
	// operator or a faulty client could (junk, copies, forgeries).
	InjectRaw func(t testing.TB, name string, data []byte)
	// Crash drops a client's broker session abruptly, without releasing
	// anything, as a killed process would; the Semaphore is unusable after.
	Crash func(t testing.TB, s tokensem.Semaphore)
	// Inventory returns the reconciler's view of a semaphore the backend
	// opened.
	Inventory func(s tokensem.Semaphore) driver.Inventory
	// Delete deletes semaphore name (Delete, or ForceDelete if force)
	// through a connection of its own. It is also called from t.Cleanup,
	// where t.Context() is done: bound it with CleanupContext.
	Delete func(t testing.TB, name string, force bool) error
	// List lists the broker's semaphores.
	List func(t testing.TB) ([]tokensem.Info, error)
	// ReplaceConfig replaces semaphore name's stored configuration with
	// edit of it, as an operator or a hostile writer could. nil: the
	// tests that need it skip.
	ReplaceConfig func(t testing.TB, name string, edit func(old []byte) []byte)
}

// Options are the semaphore options the suite varies.
type Options struct {
	Lease time.Duration // 0: the backend's default
	Key   []byte        // nil: unsigned
	// Logger receives the semaphore's log records (nil: the backend's
	// default). A backend must pass it to the semaphore: the suite reads
	// it (see ReissueMessage).
	Logger *slog.Logger
	// Observer receives the semaphore's events (nil: none); a backend must
	// pass it to the semaphore (see testUseReports).
	Observer tokensem.Observer
}

// Meter counts concurrent holders as observed by the holders themselves: it
// is the external check of the at-most-N guarantee.
type Meter struct {
	mu       sync.Mutex
	cur, max int
	total    int
}

// Enter records a holder starting to use the resource.
func (m *Meter) Enter() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cur++
	m.total++
	m.max = max(m.max, m.cur)
}

// Leave records a holder stopping.
func (m *Meter) Leave() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cur--
}

// Max returns the highest concurrency seen; Total the number of entries.
func (m *Meter) Max() int   { m.mu.Lock(); defer m.mu.Unlock(); return m.max }
func (m *Meter) Total() int { m.mu.Lock(); defer m.mu.Unlock(); return m.total }

// eventually polls cond until it holds or d passes.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// CleanupContext returns a context that ends after d, for work that also
// runs in a t.Cleanup (where t.Context() has ended already).
func CleanupContext(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// Context returns a context that ends with the test or after d, whichever
// comes first, so a broker that stops answering fails the call that waited
// instead of hanging the package until go test's timeout.
func Context(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

package tokensem

import (
	"context"
	"time"
)

// Semaphore is a distributed counting semaphore of a fixed number of
// permits. Implementations (natssem.Semaphore, amqpsem.Semaphore) are safe
// for concurrent use by many goroutines; every process that opens the same
// semaphore shares its permits.
type Semaphore interface {
	// Acquire blocks until a permit is held or ctx ends. Waiters are served
	// by class (see WithPriority), and within a class in the order they
	// started waiting. If ctx ends first, Acquire returns
	// ctx.Err() itself (err == context.Canceled holds, as with x/sync's
	// semaphore), promptly: the broker calls under way are abandoned, not
	// awaited, so it returns within about a broker round trip of ctx's end
	// (each round trip bounded by the request timeout). On any failure it
	// leaves the semaphore unchanged: no permit is taken and no token is
	// stranded. If ctx is already done, Acquire returns ctx.Err() without
	// contacting the broker.
	Acquire(ctx context.Context) (Permit, error)
	// TryAcquire takes a permit if one is free now and returns ErrNoPermit
	// at once otherwise. ctx bounds the broker round trips.
	TryAcquire(ctx context.Context) (Permit, error)
	// Status takes a census of the semaphore's tokens and holders.
	Status(ctx context.Context) (Status, error)
	// Close stops the semaphore's background work and makes later calls
	// return ErrClosed. Permits already held stay valid until released or
	// lost. Close is idempotent.
	Close() error
}

// Permit is one held permit. It owns the renewal of its lease until it is
// released or lost.
type Permit interface {
	// Token returns the token this permit holds.
	Token() Token
	// Fence returns the fencing number of this permit: it is larger than
	// the fence of every earlier holder of the same slot, so a protected
	// resource that remembers the highest fence it has seen per slot can
	// reject a stale holder.
	Fence() uint64
	// Deadline returns the local time at which the permit is lost unless a
	// renewal lands first (a natssem permit renews itself well before), or
	// the zero time for a permit without a lease (an amqpsem permit is held
	// until its connection drops).
	Deadline() time.Time
	// Done is closed when the permit is released or lost.
	Done() <-chan struct{}
	// Err is nil while the permit is held, wraps ErrLeaseLost after a loss
	// (with the cause) and is ErrReleased after a successful Release.
	Err() error
	// Release returns the permit to the semaphore. A second call returns
	// ErrReleased; a call after a loss returns the loss (ErrLeaseLost) and
	// touches nothing, because the token may already belong to someone else.
	Release(ctx context.Context) error
}

// Status is a census of one semaphore.
type Status struct {
	Name      string        `json:"name"`
	Backend   string        `json:"backend"`    // "nats" or "amqp"
	Resource  string        `json:"resource"`   // what holds the tokens: the NATS stream or the RabbitMQ queue
	Permits   int           `json:"permits"`    // configured N
	Epoch     uint64        `json:"epoch"`      // current token generation
	Lease     time.Duration `json:"lease_ns"`   // holders' lease
	Tokens    int           `json:"tokens"`     // token messages present (valid or not)
	Available int           `json:"available"`  // valid tokens not held
	Held      int           `json:"held"`       // permits held now
	Waiting   int           `json:"waiting"`    // callers blocked in Acquire
	Duplicate []int         `json:"duplicates"` // indices with more than one token
	Missing   []int         `json:"missing"`    // indices in [0, N) with no token
	Invalid   int           `json:"invalid"`    // junk, forged or retired tokens
	Healthy   bool          `json:"healthy"`    // Tokens == Permits, nothing duplicated, missing or invalid
	Holders   []Holder      `json:"holders"`    // the held slots; who holds them when the backend can tell (NATS)
	Warnings  []string      `json:"warnings"`   // anything odd the census noticed
}

// Count is a cheap reading of a semaphore's use from the broker's own
// counters and records, in one or two round trips: no token is read or
// moved, unlike the census behind Status. It is an estimate — a token being claimed or
// handed on counts as held for that moment, and duplicate or missing
// tokens are not told apart — which a metrics scrape or an autoscaler can
// afford to take often. Status is exact.
type Count struct {
	Permits   int `json:"permits"`   // configured N, as last read
	Available int `json:"available"` // tokens ready to be taken
	Held      int `json:"held"`      // tokens out with holders (or being claimed)
	Waiting   int `json:"waiting"`   // callers blocked in Acquire
}

// Counter is a Semaphore that can Count: natssem and amqpsem semaphores
// are.
type Counter interface {
	Count(ctx context.Context) (Count, error)
}

// Info describes one semaphore found by a backend's List.
type Info struct {
	Name    string        `json:"name"`
	Backend string        `json:"backend"`            // "nats" or "amqp"
	Permits int           `json:"permits"`            // configured N
	Lease   time.Duration `json:"lease_ns,omitempty"` // holders' lease (NATS)
	// State is "ready", or "creating" for a semaphore whose Init has not
	// finished (or died half-way; the next Init starts it over), or
	// "deleting", or "invalid" for one whose configuration cannot be read
	// (see ErrInvalidRecord; Permits and Lease are then 0, and ForceDelete
	// removes it), or on RabbitMQ "unreadable" for one whose configuration
	// a broker error or a timeout kept from being read (Permits 0).
	State string `json:"state"`
	// Warning says, for a State "invalid" or "unreadable", what is wrong with the
	// configuration (clipped: it quotes a few dozen bytes at most).
	Warning string `json:"warning,omitempty"`
}

// Holder describes one held permit in a Status. Owner and Since are empty
// where the backend cannot tell (RabbitMQ).
type Holder struct {
	Index int       `json:"index"`
	Owner string    `json:"owner,omitempty"`  // holder name (default host:pid)
	Since time.Time `json:"renewed,omitzero"` // server time of the last renewal
}

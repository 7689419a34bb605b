package tokensem

import (
	"errors"
	"fmt"
)

// Sentinel errors shared by every backend. Backends wrap broker errors with
// %w so that errors.Is matches both the sentinel and the cause.
var (
	// ErrNoPermit is returned by TryAcquire when no permit is free right now.
	ErrNoPermit = errors.New("tokensem: no permit available")
	// ErrLeaseLost is reported by Permit.Err (and returned by Release) once a
	// permit can no longer be trusted: its lease ran out, its connection or
	// channel closed, or another holder took over its slot. It wraps the cause.
	ErrLeaseLost = errors.New("tokensem: permit lost")
	// ErrReleased is returned by a second Release and by Err after a release.
	ErrReleased = errors.New("tokensem: permit already released")
	// ErrClosed is returned by calls on a closed Semaphore.
	ErrClosed = errors.New("tokensem: semaphore closed")
	// ErrNotInitialized is returned by Open when the semaphore does not exist
	// (or its creation never finished).
	ErrNotInitialized = errors.New("tokensem: semaphore not initialized")
	// ErrPermitMismatch is returned by Init when the semaphore already exists
	// with a different number of permits.
	ErrPermitMismatch = errors.New("tokensem: permit count mismatch")
	// ErrLeaseMismatch is returned by Init when a lease was asked for
	// explicitly and the semaphore already exists with another one: the
	// lease is fixed when the semaphore is created.
	ErrLeaseMismatch = errors.New("tokensem: lease mismatch")
	// ErrHeld is returned by a backend's Delete while any permit of the
	// semaphore is held; the semaphore is left unchanged. ForceDelete
	// deletes it anyway.
	ErrHeld = errors.New("tokensem: semaphore has holders")
	// ErrInvalidName is returned for a semaphore name that is not safe in
	// NATS subjects and AMQP queue names (see ValidateName).
	ErrInvalidName = errors.New("tokensem: invalid semaphore name")
	// ErrInvalidPermits is returned for a permit count that is not positive
	// or is above MaxPermits.
	ErrInvalidPermits = errors.New("tokensem: invalid permit count")
	// ErrInvalidOption is wrapped by every option that rejects its value.
	ErrInvalidOption = errors.New("tokensem: invalid option")
	// ErrInvalidToken is returned by driver.Codec.Decode for bytes that are not a
	// token of a supported format version.
	ErrInvalidToken = errors.New("tokensem: invalid token")
	// ErrForgedToken is returned by driver.Codec.Decode when a signing key is set and
	// the token's signature is missing or wrong.
	ErrForgedToken = errors.New("tokensem: forged or unsigned token")
	// ErrInvalidRecord is wrapped by every error about a record a backend
	// stored and read back malformed, too large or out of bounds: a
	// semaphore's configuration (Open, Init, Status and the rest fail for
	// that semaphore alone; ForceDelete removes it), and the records a
	// backend reads beside it. The error quotes at most a few dozen bytes
	// of the record. docs/protocol-nats.md and docs/protocol-rabbitmq.md list what each backend checks.
	ErrInvalidRecord = errors.New("tokensem: invalid stored record")
	// ErrKeyMismatch is returned by Init and Open when the signing key given
	// (or its absence) does not match the one the semaphore was created with.
	ErrKeyMismatch = errors.New("tokensem: signing key mismatch")
	// ErrUnavailable is wrapped by every error that comes from the broker
	// not answering or failing a request (unreachable, timed out, no
	// leader during an election, JetStream or a queue temporarily down):
	// trying again later may succeed. The broker's own error is wrapped
	// beside it.
	ErrUnavailable = errors.New("tokensem: broker unavailable")
	// ErrPermissionDenied wraps an operation the broker refused for the
	// connected user's permissions (a NATS permissions violation, a
	// RabbitMQ access refusal). Trying again does not help; the error
	// names the subject, queue or exchange that was refused.
	ErrPermissionDenied = errors.New("tokensem: permission denied by the broker")
	// ErrRefused wraps a request the broker refused for a reason that
	// waiting does not change: a configuration this broker or account does
	// not allow (replicas on a server that is not clustered, an account's
	// stream or storage limit, a stream of the same name with another
	// configuration). The broker's own error, wrapped beside it, names the
	// reason. Backends fail such a request at once instead of retrying it.
	ErrRefused = errors.New("tokensem: refused by the broker")
	// ErrPriorityUnsupported is returned by a wait asked to wait in a class
	// other than 0 (see WithPriority) on a broker that cannot serve
	// classes: NATS servers before 2.12, whose consumers have no
	// prioritized policy. The semaphore is left unchanged.
	ErrPriorityUnsupported = errors.New("tokensem: priority classes need a broker that serves them")
	// ErrTooManyWaiters is returned by Acquire when the broker refuses another
	// waiting caller (the waiter limit set when the semaphore was created).
	ErrTooManyWaiters = errors.New("tokensem: too many waiters")
	// ErrWeightExceedsPermits is returned by AcquireN and TryAcquireN when
	// more permits are asked for than the semaphore has (or has left after
	// a resize shrank it while the caller waited).
	ErrWeightExceedsPermits = errors.New("tokensem: weight exceeds the semaphore's permits")
	// ErrAmbiguousOrder is returned by AcquireAll when two of the semaphores
	// it is given cannot be put in one order every process agrees on: the
	// same semaphore twice, or two with the same name on the same kind of
	// broker.
	ErrAmbiguousOrder = errors.New("tokensem: semaphores cannot be ordered")
)

// PermitMismatchError is the error Init returns when the semaphore exists
// with another number of permits; errors.Is matches it to
// ErrPermitMismatch, and errors.As gives both counts:
//
//	var pm *tokensem.PermitMismatchError
//	if errors.As(err, &pm) {
//		log.Printf("%s has %d permits; resize it to use %d", pm.Name, pm.Have, pm.Want)
//	}
type PermitMismatchError struct {
	Name string // the semaphore
	Have int    // permits it has
	Want int    // permits Init asked for
}

func (e *PermitMismatchError) Error() string {
	return fmt.Sprintf("%v: %s has %d permits, not %d", ErrPermitMismatch, e.Name, e.Have, e.Want)
}

// Is makes errors.Is(err, ErrPermitMismatch) hold.
func (e *PermitMismatchError) Is(target error) bool { return target == ErrPermitMismatch }

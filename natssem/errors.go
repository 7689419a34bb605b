package natssem

import (
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem"
)

// errTakenOver is the cause of a loss when another client's compare-and-set
// proves it took the slot over.
var errTakenOver = errors.New("natssem: slot taken over by another holder")

// errLeaseExpired is the cause of a loss when renewals failed until the
// local deadline, after which another client could take the slot over.
var errLeaseExpired = errors.New("natssem: lease expired before a renewal succeeded")

// JetStream API error codes matched by natssem (nats-server's
// jetstream_errors_generated.go) that nats.go has no sentinel for.
const (
	// jsNoMessageFound (10037) and jsSequenceNotFound (10043) answer a
	// delete of a message that is already gone.
	jsNoMessageFound   jetstream.ErrorCode = 10037
	jsSequenceNotFound jetstream.ErrorCode = 10043
	// jsDuplicateInProcess (10158): a replicated stream is still storing
	// another publish with the same message ID.
	jsDuplicateInProcess jetstream.ErrorCode = 10158
)

// refusalCodes are the JetStream API errors that say a request can never
// succeed as made, whatever the cluster's state: a configuration this
// server or account does not allow. wrapBrokerErr makes them
// tokensem.ErrRefused, which no caller retries. Errors of a cluster in
// transition (no leader 10009, offline 10118/10119, no peers for placement
// 10005 while a node is down) are not among them.
var refusalCodes = []jetstream.ErrorCode{
	10006, // JetStream not in clustered mode
	10010, // JetStream clustering support required
	10026, // maximum consumers limit reached
	10027, // maximum number of streams reached
	10028, // insufficient memory resources available (account limit)
	10036, // not currently supported in clustered mode
	10047, // insufficient storage resources available (account limit)
	10052, // invalid stream configuration
	10053, // general stream limits exceeded
	10058, // stream name already in use with a different configuration
	10074, // replicas > 1 not supported in non-clustered mode
	10113, // account requires a stream config to have max bytes set
	10122, // stream max bytes exceeds account limit max stream bytes
}

// jsReplicasNotSupported (10074) answers replicas > 1 on a server that is
// not clustered.
const jsReplicasNotSupported jetstream.ErrorCode = 10074

// isAPIError reports whether err carries a JetStream API error with one of
// the given codes.
func isAPIError(err error, codes ...jetstream.ErrorCode) bool {
	var ae *jetstream.APIError
	if !errors.As(err, &ae) || ae == nil { // a nil *APIError passed as an error
		return false
	}
	for _, c := range codes {
		if ae.ErrorCode == c {
			return true
		}
	}
	return false
}

// brokerError is a request the broker failed or did not answer. It matches
// tokensem.ErrUnavailable and the broker's error.
type brokerError struct{ err error }

func (e brokerError) Error() string   { return "natssem: " + e.err.Error() }
func (e brokerError) Unwrap() []error { return []error{tokensem.ErrUnavailable, e.err} }

// refusalError is a request the broker refused for good (refusalCodes).
// It matches tokensem.ErrRefused and the broker's error.
type refusalError struct{ err error }

func (e refusalError) Error() string {
	var ae *jetstream.APIError
	if !errors.As(e.err, &ae) {
		return "natssem: refused: " + e.err.Error()
	}
	msg := fmt.Sprintf("natssem: the server refused: %s (JetStream error %d)", ae.Description, ae.ErrorCode)
	if ae.ErrorCode == jsReplicasNotSupported {
		msg += "; it is a single node: ask for 1 replica, or run a cluster"
	}
	return msg
}
func (e refusalError) Unwrap() []error { return []error{tokensem.ErrRefused, e.err} }

// wrapBrokerErr marks err as a broker error, or as a refusal
// (refusalCodes). nil stays nil; an error that already is one of them, or a
// refusal for the user's permissions, is returned as is.
func wrapBrokerErr(err error) error {
	switch {
	case err == nil, errors.Is(err, tokensem.ErrUnavailable), errors.Is(err, tokensem.ErrRefused),
		errors.Is(err, tokensem.ErrPermissionDenied):
		return err
	case isAPIError(err, refusalCodes...):
		return refusalError{err}
	}
	return brokerError{err}
}

// permissionError is a publish or subscription the broker refused for the
// user's permissions (rights.go). It matches tokensem.ErrPermissionDenied
// and nats.go's error, which wraps nats.ErrPermissionViolation.
type permissionError struct {
	name string // of the semaphore; "" for List
	r    refusal
}

// refused returns the error of refusal r met by semaphore name.
func refused(name string, r refusal) error { return permissionError{name, r} }

func (e permissionError) Error() string {
	what := "list"
	if e.name != "" {
		what = e.name
	}
	msg := fmt.Sprintf("natssem: %s: permission denied: the broker refused to let this user %s to %q", what, e.r.op, e.r.subject)
	if e.r.op == "subscribe" {
		msg += " (an inbox: give the user an inbox prefix of its own that it may subscribe to: nats.CustomInboxPrefix, seminit --inbox-prefix)"
	}
	return msg
}

func (e permissionError) Unwrap() []error {
	return []error{tokensem.ErrPermissionDenied, e.r.err}
}

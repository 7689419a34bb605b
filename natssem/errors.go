package natssem

import (
	"errors"

	"github.com/tokensem/tokensem"
)

// errTakenOver is the cause of a loss when another client's compare-and-set
// proves it took the slot over.
var errTakenOver = errors.New("natssem: slot taken over by another holder")

// errLeaseExpired is the cause of a loss when renewals failed until the
// local deadline, after which another client could take the slot over.
var errLeaseExpired = errors.New("natssem: lease expired before a renewal succeeded")

// brokerError is a request the broker failed or did not answer. It matches
// tokensem.ErrUnavailable and the broker's error.
type brokerError struct{ err error }

func (e brokerError) Error() string   { return "natssem: " + e.err.Error() }
func (e brokerError) Unwrap() []error { return []error{tokensem.ErrUnavailable, e.err} }

// wrapBrokerErr marks err as a broker error (nil stays nil; an error that
// already is one is returned as is).
func wrapBrokerErr(err error) error {
	if err == nil || errors.Is(err, tokensem.ErrUnavailable) {
		return err
	}
	return brokerError{err}
}

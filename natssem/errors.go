package natssem

import (
	"errors"
	"fmt"
)

// errTakenOver is the cause of a loss when another client's compare-and-set
// proves it took the slot over.
var errTakenOver = errors.New("natssem: slot taken over by another holder")

// errLeaseExpired is the cause of a loss when renewals failed until the
// local deadline, after which another client could take the slot over.
var errLeaseExpired = errors.New("natssem: lease expired before a renewal succeeded")

func wrapBrokerErr(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("natssem: %w", err)
}

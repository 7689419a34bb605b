package driver

import "errors"

var (
	// ErrNotCurrent marks a delivered token that is not a usable token of the
	// semaphore: junk, forged, of another semaphore, or retired.
	ErrNotCurrent = errors.New("driver: not a current token")

	// ErrConflict is returned by Inventory.Issue when the slot changed since
	// the census (another reconciler issued it, or a holder appeared).
	ErrConflict = errors.New("driver: slot changed since the census")
)

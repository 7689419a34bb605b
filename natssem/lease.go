package natssem

import "time"

// The lease arithmetic, in one place.
//
// A holder believes it holds its permit until deadline(sent), where sent is
// when it sent its last record write that landed. Another client takes the
// slot over only once that write is a whole lease old by the server's
// clock, and the server stamps a write no earlier than it was sent, so a
// holder gives up lease/5 before anyone can take over. That lease/5 is the
// whole tolerance for what can make the two clocks disagree: a server clock
// stepped forward, skew between the node that stamps a record and the one
// that answers the taker's consumer info, and a holder's process stalled
// between reading its clock and acting (see docs/protocol-nats.md).
//
// A holder renews every renewEvery and, after a failed renewal, retries
// every retryEvery until its deadline. Claim hands out a permit only with
// at least minHold left before its deadline.

// renewEvery is the interval between a holder's renewals.
func renewEvery(lease time.Duration) time.Duration { return lease / 3 }

// retryEvery is the pause before retrying a failed renewal.
func retryEvery(lease time.Duration) time.Duration { return lease / 10 }

// safetyMargin is how long before the takeover point a holder gives up.
func safetyMargin(lease time.Duration) time.Duration { return lease / 5 }

// deadline is when a holder whose last landed write was sent at sent stops
// believing it holds the permit.
func deadline(sent time.Time, lease time.Duration) time.Time {
	return sent.Add(lease - safetyMargin(lease))
}

// minHold is the least time before its deadline with which claim hands out
// a permit: one that late would be lost before its holder could use it or
// renew it.
func minHold(lease time.Duration) time.Duration { return lease / 10 }

// maxRequestTimeout is the longest request timeout a semaphore of this
// lease accepts: a round trip that may take as long as a holder's whole
// belief in its permit cannot be bounded usefully.
func maxRequestTimeout(lease time.Duration) time.Duration { return lease - safetyMargin(lease) }

// defaultRequestTimeout is the request timeout when none is set: the
// package default, but short enough that a renewal that does not answer
// leaves time for a retry before the deadline.
func defaultRequestTimeout(def, lease time.Duration) time.Duration { return min(def, lease/4) }

// Package testhook holds the few knobs through which tests in this module
// reach behaviour no real fault can produce on demand. Every knob is zero,
// and changes nothing, unless a test sets it.
package testhook

import (
	"sync/atomic"
	"time"
)

var serverClockAhead atomic.Int64

// SetServerClockAhead makes natssem read the server's clock d ahead of what
// the server says (negative: behind). It stands for a server whose clock
// was stepped forward, or a cluster whose node answering consumer info is
// ahead of the node that stamped the slot records: the two clocks a
// takeover compares.
func SetServerClockAhead(d time.Duration) { serverClockAhead.Store(int64(d)) }

// ServerClockAhead returns what SetServerClockAhead set.
func ServerClockAhead() time.Duration { return time.Duration(serverClockAhead.Load()) }

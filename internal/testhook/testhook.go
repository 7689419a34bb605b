// Package testhook holds the few knobs through which tests in this module
// reach behaviour no real fault can produce on demand, and through which
// they learn of events only the library sees. Every knob is zero, and
// changes nothing, unless a test sets it.
package testhook

import (
	"sync"
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

var (
	reissueMu   sync.Mutex
	reissues    int
	lastReissue string
)

// NotePullReissue records that a waiting caller lost its place in the
// broker's queue of waiters and asked again at the back (its pull went
// silent, expired, or was ended by the server, as a consumer's leader
// change ends every pull waiting on it). Backends call it; tests of FIFO
// order read it, since the order is not promised across such a loss.
func NotePullReissue(reason string) {
	reissueMu.Lock()
	reissues++
	lastReissue = reason
	reissueMu.Unlock()
}

// PullReissues returns how many NotePullReissue calls there were, and the
// last reason.
func PullReissues() (int, string) {
	reissueMu.Lock()
	defer reissueMu.Unlock()
	return reissues, lastReissue
}

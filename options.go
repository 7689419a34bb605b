package tokensem

import "time"

// Defaults and bounds of the settings every backend shares (each backend
// takes them through its own options).
const (
	// DefaultLease is how long a silent holder keeps its permit: a crashed
	// holder's permit returns within one lease. Live holders renew every
	// Lease/3, so long tasks never expire while their process runs.
	DefaultLease = 15 * time.Second
	// MinLease is the shortest lease accepted.
	MinLease = 500 * time.Millisecond
	// MaxLease is the longest lease accepted.
	MaxLease = 24 * time.Hour
	// DefaultRequestTimeout bounds one broker round trip (never the wait for
	// a permit, which only ctx bounds).
	DefaultRequestTimeout = 5 * time.Second
)

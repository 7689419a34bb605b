// Command fleet is tokensem's quickstart: it starts an embedded NATS
// JetStream server, creates a semaphore of 3 permits, and runs 10 worker
// processes that contend for them. It prints the live number of holders
// (never above 3), kills one holder with SIGKILL in the middle of its work,
// and shows its permit coming back within the lease.
//
//	go run ./examples/fleet
//
// Each worker is this same program started with the argument "worker". A
// worker reports "enter" after acquiring and "leave" before releasing, and
// waits for the parent's "ok" each time, so the parent's count of holders is
// exact, not sampled.
package main

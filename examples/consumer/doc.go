// Command consumer is an event-driven consumer gated by a distributed
// semaphore: jobs arrive on a JetStream work stream (DEMO_JOBS, apart from
// the semaphore's own token stream), and several workers — each on its own
// connection, as separate processes would be — take a permit first and only
// then pull the next job, process it, acknowledge it, and release the
// permit. So at most -permits jobs are in processing at once across all
// workers, however many workers there are, and a worker never takes a job
// it has no capacity for.
//
//	go run ./examples/consumer                 # embedded NATS
//	go run ./examples/consumer -url nats://... # an existing server (its DEMO_JOBS stream is purged)
//
// It prints how many jobs each worker did, checks that every job was
// processed exactly once and that the most jobs in processing at once never
// exceeded -permits, and exits 1 otherwise. If a worker's permit is lost
// mid-job, the worker stops, naks the job (it is redelivered to another
// worker) and moves on.
package main

// Package chaos proves tokensem's safety under faults with real processes
// and real brokers, and checks the recorded history with porcupine.
//
// Each scenario runs worker processes (this test binary, re-executed with
// TOKENSEM_CHAOS_WORKER set; see RunWorker) that acquire a permit, hold it
// for a few milliseconds and release it, over and over, each through its
// own loopback fault proxy, and report every step with its wall-clock time
// to a meter in the test process. Meanwhile the harness injects faults:
// SIGKILL of a holder (a new worker takes its place), SIGSTOP/SIGCONT of a
// holder for longer than its lease, a cut or a delay of a holder's broker
// connection, a restart of the NATS server on the same store, the loss and
// return of one node of a 3-node NATS cluster (stream and KV replicated 3
// ways), and with TOKENSEM_CHAOS_RABBIT_RESTART=1 a RabbitMQ restart.
//
// The history is checked against Model, a per-slot fenced lock: a slot is
// taken only while free and only with a fence above every earlier one, and
// freed only by its holding. A hold ends at its Release call, or when its
// holder saw the loss; a loss or a death may have freed the slot as early as
// the fault that hit the holder (a frozen process cannot see its loss in
// time: the fence is the remedy), but a loss with no fault must have been
// seen before anyone else took the slot. Each fault is recorded as an
// interval, from just before the harness applies it until it is over, since
// a worker may begin a hold while a signal, a cut or a shutdown is on its
// way; which holds a fault hits is argued in charge. porcupine must find the
// history linearizable; Check also names fence regressions, slots out of
// range and takeovers with no fault to excuse them, and counts the holders
// at once by their own account and those whose fence was still the newest
// (what a fenced resource accepts; never more than N). After the run one
// reconcile must leave exactly N valid tokens, and a killed holder's slot
// must come back within the lease plus a bound.
//
// The seam scenarios (TestChaosSeamsNATS, TestChaosSeamsRabbit; see
// seams_test.go) reshape the semaphore under the workers: Delete and
// ForceDelete, each followed by an Init of the name with another count and
// (NATS) lease, resizes, repairs, lost claim queues (RabbitMQ) and stalled
// links. Their history is checked against the Timeline the harness
// recorded (CheckTimeline): fences grow per slot across lives, repairs and
// resizes; no slot, and no slot of a later life, is held before every
// earlier holder was told; and no more running holders at once than the
// counts in force allow (max(old, new) for 2 s after a resize). A stalled
// link excuses nothing there: its holder still runs its timers.
//
// TOKENSEM_CHAOS selects the profile: short (default, about 25 s per
// scenario, in CI), long (5 minutes per scenario), or off.
// TOKENSEM_CHAOS_DUMP names a directory where each run writes its history
// (holds, faults, timeline) as JSON.
package chaos

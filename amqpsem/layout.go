package amqpsem

import (
	"strconv"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Resources names the broker resources of one semaphore: what an operator
// grants rights on (docs/permissions-rabbitmq.md) and watches. Semaphore
// names cannot contain '.', so no two semaphores' resources collide.
type Resources struct {
	Queue       string // the token queue
	ConfigQueue string // the configuration queue
	Exchange    string // every publish to the semaphore's queues goes through it
	LockQueue   string // the exclusive queue of the creation lock, while it is held
	ClaimPrefix string // a slot's claim queue is ClaimPrefix and the slot's index
}

// ResourcesOf returns the resources of semaphore name. It does not check
// the name.
func ResourcesOf(name string) Resources {
	return Resources{
		Queue: tokenQueue(name), ConfigQueue: configQueue(name), Exchange: exchangeName(name),
		LockQueue: lockQueue(name), ClaimPrefix: claimPrefix(name),
	}
}

// tokenQueue returns the token queue of semaphore name.
func tokenQueue(name string) string { return "tokensem." + name }

// exchangeName returns the exchange every publish to semaphore name's
// queues goes through (see bind): a user allowed to write to it reaches
// this semaphore's queues and no other's, which the default exchange
// would not give.
func exchangeName(name string) string { return "tokensem." + name + ".x" }

func configQueue(name string) string { return "tokensem." + name + ".cfg" }
func lockQueue(name string) string   { return "tokensem." + name + ".lock" }
func claimPrefix(name string) string { return "tokensem." + name + ".claim." }
func claimQueue(name string, index int) string {
	return claimPrefix(name) + strconv.Itoa(index)
}

// tokenQueueArgs returns the arguments of the token queue for a broker of
// the given version. Quorum queues drop a message silently once it has been
// returned more than the delivery limit. RabbitMQ 4.x sets a default limit
// of 20, so the limit is disabled there with -1. On 3.x there is no default
// limit, and -1 or 0 would drop a token on its first return (measured on
// 3.10.8), so nothing is set.
func tokenQueueArgs(queueType, version string) amqp.Table {
	args := amqp.Table{"x-queue-type": queueType}
	if queueType == Quorum && majorVersion(version) >= 4 {
		args["x-delivery-limit"] = int64(-1)
	}
	return args
}

func majorVersion(v string) int {
	major, _, _ := strings.Cut(v, ".")
	n, err := strconv.Atoi(major)
	if err != nil {
		return 0
	}
	return n
}

// bind makes publishes to the semaphore's exchange (a direct exchange)
// with routing key q reach queue q: it declares the exchange and binds q
// to it, both idempotent, on ch, the channel about to publish (the broker
// runs a channel's commands in order, so the binding is there for the
// publish). Every write binds, so an exchange or binding someone deleted
// comes back with the next write instead of failing every publish.
func (s *Semaphore) bind(ch *channel, q string) error {
	x := exchangeName(s.name)
	if err := ch.ExchangeDeclare(x, amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
		return err
	}
	return ch.QueueBind(q, q, x, false, nil)
}

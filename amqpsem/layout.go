package amqpsem

import (
	"strconv"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Queue names of a semaphore called name. Semaphore names cannot contain
// '.', so these never collide across semaphores.

// QueueName returns the token queue of semaphore name.
func QueueName(name string) string { return "tokensem." + name }

// exchangeName returns the exchange every publish to semaphore name's
// queues goes through (see bind): a user allowed to write to it reaches
// this semaphore's queues and no other's, which the default exchange
// would not give.
func exchangeName(name string) string { return "tokensem." + name + ".x" }

func configQueue(name string) string { return "tokensem." + name + ".cfg" }
func lockQueue(name string) string   { return "tokensem." + name + ".lock" }
func claimQueue(name string, index int) string {
	return "tokensem." + name + ".claim." + strconv.Itoa(index)
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

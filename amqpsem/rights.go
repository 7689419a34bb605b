package amqpsem

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem"
)

// RabbitMQ refuses an operation the user's permissions do not allow with a
// channel error, 403 ACCESS_REFUSED "access to queue 'Q' in vhost 'V'
// refused for user 'U'", which closes the channel (a publish learns of it
// only then). The same code with another text ("in exclusive use") is a
// slot claimed by someone else, which is retried: the text tells them
// apart. 3.10 does not say which permission was missing; the operation
// does (see permissionFor).

// permissionError is an operation the broker refused for the user's
// permissions. It matches tokensem.ErrPermissionDenied, and is never
// retried.
type permissionError struct {
	op       string // the AMQP operation: declare, delete, consume, get, purge, bind, publish
	perm     string // the permission it needs on the resource: configure, write or read
	resource string // "queue 'Q'" or "exchange 'X'"
	vhost    string
	user     string
	reason   string // the broker's, when it could not be parsed
}

func (e *permissionError) Error() string {
	if e.resource == "" {
		return fmt.Sprintf("amqpsem: permission denied: %s needs a permission the user lacks: %s", e.op, e.reason)
	}
	return fmt.Sprintf("amqpsem: permission denied: %s permission on %s in vhost '%s' refused for user '%s' (%s)",
		e.perm, e.resource, e.vhost, e.user, e.op)
}

func (e *permissionError) Unwrap() error { return tokensem.ErrPermissionDenied }

var refusalText = regexp.MustCompile(`access to (queue|exchange) '([^']*)' in vhost '([^']*)' refused for user '([^']*)'`)

// isRefused reports whether err is the broker refusing an operation for
// the user's permissions (not a claim in exclusive use).
func isRefused(err error) (*amqp.Error, bool) {
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.AccessRefused || !strings.Contains(ae.Reason, "refused for user") {
		return nil, false
	}
	return ae, true
}

// refusal returns err as a permissionError of op when the broker refused
// it for the user's permissions, else err itself.
func refusal(op string, err error) error {
	ae, ok := isRefused(err)
	if !ok {
		return err
	}
	pe := &permissionError{op: op, reason: ae.Reason}
	if m := refusalText.FindStringSubmatch(ae.Reason); m != nil {
		pe.resource = m[1] + " '" + m[2] + "'"
		pe.vhost, pe.user = m[3], m[4]
		pe.perm = permissionFor(op, m[1])
	}
	return pe
}

// permissionFor returns the permission that operation op needs on a
// resource of the given kind (queue or exchange): RabbitMQ's access
// control table.
func permissionFor(op, kind string) string {
	switch op {
	case "declare", "delete":
		return "configure"
	case "consume", "get", "purge":
		return "read"
	case "bind":
		if kind == "queue" {
			return "write" // on the queue bound; read on the exchange
		}
		return "read"
	}
	return "write" // publish
}

func (ch *channel) QueueDeclare(name string, durable, autoDelete, exclusive, noWait bool, args amqp.Table) (amqp.Queue, error) {
	q, err := ch.Channel.QueueDeclare(name, durable, autoDelete, exclusive, noWait, args)
	return q, refusal("declare", err)
}

func (ch *channel) QueueDelete(name string, ifUnused, ifEmpty, noWait bool) (int, error) {
	n, err := ch.Channel.QueueDelete(name, ifUnused, ifEmpty, noWait)
	return n, refusal("delete", err)
}

func (ch *channel) QueuePurge(name string, noWait bool) (int, error) {
	n, err := ch.Channel.QueuePurge(name, noWait)
	return n, refusal("purge", err)
}

func (ch *channel) QueueBind(name, key, exchange string, noWait bool, args amqp.Table) error {
	return refusal("bind", ch.Channel.QueueBind(name, key, exchange, noWait, args))
}

func (ch *channel) ExchangeDeclare(name, kind string, durable, autoDelete, internal, noWait bool, args amqp.Table) error {
	return refusal("declare", ch.Channel.ExchangeDeclare(name, kind, durable, autoDelete, internal, noWait, args))
}

func (ch *channel) ExchangeDelete(name string, ifUnused, noWait bool) error {
	return refusal("delete", ch.Channel.ExchangeDelete(name, ifUnused, noWait))
}

func (ch *channel) Consume(queue, consumer string, autoAck, exclusive, noLocal, noWait bool, args amqp.Table) (<-chan amqp.Delivery, error) {
	ds, err := ch.Channel.Consume(queue, consumer, autoAck, exclusive, noLocal, noWait, args)
	return ds, refusal("consume", err)
}

func (ch *channel) Get(queue string, autoAck bool) (amqp.Delivery, bool, error) {
	d, ok, err := ch.Channel.Get(queue, autoAck)
	return d, ok, refusal("get", err)
}

// refused returns err, or, when the broker closed the channel because it
// refused an operation for the user's permissions (a publish, whose
// refusal comes only as the channel's close), that refusal. nil stays nil.
func (ch *channel) refused(err error) error {
	if err == nil || errors.Is(err, tokensem.ErrPermissionDenied) {
		return err
	}
	if r := ch.closeReason(); r != nil {
		if _, ok := isRefused(r); ok {
			return refusal("publish", r)
		}
	}
	return err
}

// closeReason returns the error the broker closed the channel with, if it
// did.
func (ch *channel) closeReason() *amqp.Error {
	if ch.closes == nil {
		return nil
	}
	ch.closeMu.Lock()
	defer ch.closeMu.Unlock()
	if ch.closeErr == nil {
		select {
		case e, ok := <-ch.closes:
			if ok {
				ch.closeErr = e
			}
		default:
		}
	}
	return ch.closeErr
}

// denied reports whether err is a permission refusal, for the callers
// that would otherwise retry.
func denied(err error) bool { return errors.Is(err, tokensem.ErrPermissionDenied) }

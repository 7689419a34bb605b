package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/amqpsem"
)

// documented are the exit codes the usage text lists for seminit's own
// failures (exec also passes its command's status on).
var documented = map[int]bool{exitOK: true, exitFailure: true, exitUsage: true, exitUnavailable: true,
	exitSoftware: true, exitNoPermit: true, exitNoAuth: true, exitConfig: true, exitHoldLimit: true}

// TestExitCodes walks the errors the verbs can end with, as the libraries
// and the CLI make them, through exitCode: each maps to its documented
// code, and no broker failure surfaces as the generic 1.
func TestExitCodes(t *testing.T) {
	wrapped := func(err error) error { return fmt.Errorf("seminit: doing something: %w", err) }
	tests := []struct {
		name string
		err  error
		want int
	}{
		{"usage", usageErr{errors.New("--name is required")}, exitUsage},
		{"flag help", flag.ErrHelp, exitUsage},
		{"bad name", wrapped(tokensem.ErrInvalidName), exitUsage},
		{"bad permits", wrapped(tokensem.ErrInvalidPermits), exitUsage},
		{"bad option", wrapped(tokensem.ErrInvalidOption), exitUsage},
		{"not initialized", wrapped(tokensem.ErrNotInitialized), exitConfig},
		{"permit mismatch", wrapped(tokensem.ErrPermitMismatch), exitConfig},
		{"key mismatch", wrapped(tokensem.ErrKeyMismatch), exitConfig},
		{"lease mismatch", wrapped(tokensem.ErrLeaseMismatch), exitConfig},
		{"invalid stored configuration", wrapped(tokensem.ErrInvalidRecord), exitConfig},
		{"refused by the broker", wrapped(tokensem.ErrRefused), exitConfig},
		{"credentials", authErr{wrapped(amqpsem.ErrAuth)}, exitNoAuth},
		{"permission denied", wrapped(tokensem.ErrPermissionDenied), exitNoAuth},
		{"nats permissions violation", wrapped(fmt.Errorf("%w: Permissions Violation for Publish to \"x\"", nats.ErrPermissionViolation)), exitNoAuth},
		{"amqp access refused", wrapped(&amqp.Error{Code: amqp.AccessRefused, Reason: "ACCESS_REFUSED - access to queue 'q' refused"}), exitNoAuth},
		{"unreachable (dial)", unavailableErr{wrapped(amqpsem.ErrUnreachable)}, exitUnavailable},
		{"TLS", unavailableErr{wrapped(amqpsem.ErrTLS)}, exitUnavailable},
		{"amqp unreachable after dial", wrapped(amqpsem.ErrUnreachable), exitUnavailable},
		{"amqp blocked", wrapped(amqpsem.ErrBlocked), exitUnavailable},
		{"broker failure", wrapped(fmt.Errorf("%w: %w", tokensem.ErrUnavailable, jetstream.ErrNoStreamResponse)), exitUnavailable},
		{"nats no responders", classify(wrapped(nats.ErrNoResponders)), exitUnavailable},
		{"nats timeout", classify(wrapped(nats.ErrTimeout)), exitUnavailable},
		{"nats closed", classify(wrapped(nats.ErrConnectionClosed)), exitUnavailable},
		{"no JetStream", classify(wrapped(jetstream.ErrJetStreamNotEnabled)), exitUnavailable},
		{"no JetStream for the account", classify(wrapped(jetstream.ErrJetStreamNotEnabledForAccount)), exitUnavailable},
		{"amqp closed", classify(wrapped(amqp.ErrClosed)), exitUnavailable},
		{"no permit", wrapped(tokensem.ErrNoPermit), exitNoPermit},
		{"wait ran out", wrapped(context.DeadlineExceeded), exitNoPermit},
		{"too many waiters", wrapped(tokensem.ErrTooManyWaiters), exitNoPermit},
		{"permit lost", exitCodeErr{code: exitSoftware, err: tokensem.ErrLeaseLost}, exitSoftware},
		{"max hold", exitCodeErr{code: exitHoldLimit}, exitHoldLimit},
		{"command status", exitCodeErr{code: 3}, 3},
		{"unhealthy", exitCodeErr{code: exitFailure}, exitFailure},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := exitCode(tc.err)
			if got != tc.want {
				t.Fatalf("exitCode(%v) = %d, want %d", tc.err, got, tc.want)
			}
			if tc.want != 3 && !documented[got] {
				t.Fatalf("exit code %d is not documented", got)
			}
		})
	}
}

// TestOneLine: seminit prints an error chain on one line, a joined error's
// lines separated and none said twice.
func TestOneLine(t *testing.T) {
	a := errors.New("natssem: context deadline exceeded")
	err := fmt.Errorf("lost: %w", errors.Join(a, a, errors.New("natssem: connection closed")))
	if got, want := oneLine(err), "lost: natssem: context deadline exceeded; natssem: connection closed"; got != want {
		t.Fatalf("oneLine = %q, want %q", got, want)
	}
}

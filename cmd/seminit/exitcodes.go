// seminit's exit codes and the error types that carry them to run.

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"syscall"

	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem"
)

// Exit codes, after sysexits.h.
const (
	exitOK          = 0
	exitFailure     = 1  // the operation ran and failed (e.g. unhealthy)
	exitUsage       = 64 // EX_USAGE: bad flags or bad input
	exitSoftware    = 70 // EX_SOFTWARE: exec lost its permit and stopped the child
	exitUnavailable = 69 // EX_UNAVAILABLE: broker unreachable
	exitNoPermit    = 75 // EX_TEMPFAIL: no permit within --wait; delete refused while a permit is held
	exitNoAuth      = 77 // EX_NOPERM: the broker refused the credentials or an operation
	exitConfig      = 78 // EX_CONFIG: not initialized, permit-count, lease or key mismatch, invalid stored configuration, a configuration the broker refuses, a priority class it cannot serve
	exitHoldLimit   = 124
)

// signalErr is the cause of the context main cancels on a stop signal
// (stopSignals).
type signalErr struct{ sig syscall.Signal }

func (s signalErr) Error() string { return "received " + s.sig.String() }

// signalExit is the shell's exit code for the signal that ended ctx
// (128+signal), 130 when ctx ended otherwise.
func signalExit(ctx context.Context) int {
	var se signalErr
	if errors.As(context.Cause(ctx), &se) {
		return 128 + int(se.sig)
	}
	return 130
}

// usageErr marks bad flags or arguments.
type usageErr struct{ err error }

func (u usageErr) Error() string { return u.err.Error() }

func (u usageErr) Unwrap() error { return u.err }

// unavailableErr marks a broker that could not be reached.
type unavailableErr struct{ err error }

func (u unavailableErr) Error() string { return u.err.Error() }

func (u unavailableErr) Unwrap() error { return u.err }

// authErr marks credentials the broker refused.
type authErr struct{ err error }

func (a authErr) Error() string { return a.err.Error() }

func (a authErr) Unwrap() error { return a.err }

// exitCodeErr carries an explicit exit code (exec passes the child's on).
type exitCodeErr struct {
	code int
	err  error // printed when not nil
}

func (e exitCodeErr) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e exitCodeErr) Unwrap() error { return e.err }

func exitCode(err error) int {
	var (
		ec      exitCodeErr
		ue      usageErr
		ua      unavailableErr
		ae      authErr
		amqpErr *amqp.Error
	)
	switch {
	case errors.As(err, &ec):
		return ec.code
	case errors.As(err, &ue), errors.Is(err, flag.ErrHelp),
		errors.Is(err, tokensem.ErrInvalidName), errors.Is(err, tokensem.ErrInvalidPermits),
		errors.Is(err, tokensem.ErrInvalidOption), errors.Is(err, tokensem.ErrWeightExceedsPermits),
		errors.Is(err, tokensem.ErrAmbiguousOrder):
		return exitUsage
	case errors.As(err, &ae), errors.Is(err, tokensem.ErrPermissionDenied),
		errors.Is(err, nats.ErrPermissionViolation), errors.As(err, &amqpErr) && amqpErr.Code == amqp.AccessRefused:
		// The last two: a refusal a backend passed on without
		// ErrPermissionDenied.
		return exitNoAuth
	case errors.As(err, &ua):
		return exitUnavailable
	case errors.Is(err, tokensem.ErrNotInitialized), errors.Is(err, tokensem.ErrPermitMismatch),
		errors.Is(err, tokensem.ErrLeaseMismatch), errors.Is(err, tokensem.ErrKeyMismatch),
		errors.Is(err, tokensem.ErrInvalidRecord), errors.Is(err, tokensem.ErrRefused),
		errors.Is(err, tokensem.ErrPriorityUnsupported):
		return exitConfig
	case errors.Is(err, tokensem.ErrUnavailable):
		return exitUnavailable
	case errors.Is(err, tokensem.ErrNoPermit), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, tokensem.ErrTooManyWaiters), errors.Is(err, tokensem.ErrHeld):
		return exitNoPermit
	default:
		return exitFailure
	}
}

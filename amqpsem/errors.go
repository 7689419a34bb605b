package amqpsem

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/tokensem/tokensem"
)

// ErrAuth wraps a connection refused for its credentials.
var ErrAuth = errors.New("amqpsem: credentials refused")

// ErrUnreachable wraps a broker that could not be reached. It matches
// tokensem.ErrUnavailable too.
var ErrUnreachable error = &unavailable{"amqpsem: broker unreachable"}

// ErrTLS wraps a connection whose TLS handshake failed: the broker's
// certificate is not trusted (unknown authority, expired, issued for another
// host), the broker refused the client's certificate (or wanted one; also
// assumed when it closes the connection right after the handshake, before
// saying anything), or the peer does not speak TLS (an amqps:// URL for a
// plaintext port). It is not ErrUnreachable: the broker answered, and
// retrying will not help until the configuration changes. A broker that does
// not answer the handshake in time is ErrUnreachable.
var ErrTLS = errors.New("amqpsem: TLS handshake failed")

// ErrBlocked wraps a publish that did not complete while the broker was
// blocking publishers on the connection (connection.blocked: a memory or
// disk alarm; the reason is in the error). It matches
// tokensem.ErrUnavailable too.
var ErrBlocked error = &unavailable{"amqpsem: the broker blocks publishing"}

// unavailable is a sentinel of a broker failure that trying again later
// may cure: it matches tokensem.ErrUnavailable.
type unavailable struct{ msg string }

func (e *unavailable) Error() string { return e.msg }
func (e *unavailable) Unwrap() error { return tokensem.ErrUnavailable }

// brokerError is a request the broker failed or did not answer. It matches
// tokensem.ErrUnavailable and the broker's error.
type brokerError struct {
	what string
	err  error
}

func (e brokerError) Error() string   { return "amqpsem: " + e.what + ": " + e.err.Error() }
func (e brokerError) Unwrap() []error { return []error{tokensem.ErrUnavailable, e.err} }

// wrapBrokerErr marks err, from what, as a broker error (nil stays nil; an
// error that already matches tokensem.ErrUnavailable, says the semaphore
// does not exist, or is a permission refusal, which no retry cures, gets
// only the context).
func wrapBrokerErr(what string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, tokensem.ErrUnavailable), errors.Is(err, tokensem.ErrNotInitialized), errors.Is(err, tokensem.ErrClosed),
		errors.Is(err, tokensem.ErrPermissionDenied):
		return fmt.Errorf("amqpsem: %s: %w", what, err)
	}
	if _, ok := isRefused(err); ok {
		return fmt.Errorf("amqpsem: %s: %w", what, refusal(what, err))
	}
	return brokerError{what, err}
}

// errAborted marks an AMQP call cut short because its context ended.
var errAborted = errors.New("amqpsem: call aborted")

// isCode reports whether err is an AMQP error with the given reply code.
func isCode(err error, code int) bool {
	var ae *amqp.Error
	return errors.As(err, &ae) && ae.Code == code
}

// isConnectionLost reports whether err says the connection under a call
// closed (the broker closed it after another call's 541, a restart, a lost
// socket; amqp091 reports a socket that failed or was closed under it, the
// watchdog's drop among them, as 501): the Conn makes it again, and the
// call may be retried on a new channel.
func isConnectionLost(err error) bool {
	return errors.Is(err, amqp.ErrClosed) || errors.Is(err, net.ErrClosed) ||
		isCode(err, amqp.ConnectionForced) || isCode(err, amqp.InternalError) || isCode(err, amqp.FrameError)
}

// isTLSFailure reports whether err is a TLS handshake that failed for its
// content (certificates, protocol), not for the network.
func isTLSFailure(err error) bool {
	var (
		verify   *tls.CertificateVerificationError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
		record   tls.RecordHeaderError
		alert    tls.AlertError
		op       *net.OpError
	)
	return errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &hostname) ||
		errors.As(err, &invalid) || errors.As(err, &record) || errors.As(err, &alert) ||
		// crypto/tls reports an alert from the peer this way.
		errors.As(err, &op) && op.Op == "remote error"
}

// isClosed reports whether err is the peer closing or resetting the
// connection.
func isClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

package tokensem

import "fmt"

// MaxNameLen is the longest semaphore name accepted.
const MaxNameLen = 64

// ValidateName reports whether name can name a semaphore: 1 to MaxNameLen
// ASCII letters, digits, '-' or '_', starting with a letter or digit. Such a
// name is safe as a NATS subject token, a JetStream stream or KV bucket name
// and an AMQP queue name, and cannot collide with RabbitMQ's reserved "amq."
// prefix. The error wraps ErrInvalidName.
func ValidateName(name string) error {
	if name == "" {
		return fmt.Errorf("%w: empty", ErrInvalidName)
	}
	if len(name) > MaxNameLen {
		return fmt.Errorf("%w: %q is longer than %d bytes", ErrInvalidName, name, MaxNameLen)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case (c == '-' || c == '_') && i > 0:
		default:
			return fmt.Errorf("%w: %q: byte %d (%q) is not a letter, digit, '-' or '_'", ErrInvalidName, name, i, c)
		}
	}
	return nil
}

// MaxPermits is the largest permit count a semaphore may have.
const MaxPermits = 1 << 20

// ValidatePermits reports whether n is a usable permit count (1..MaxPermits).
// The error wraps ErrInvalidPermits.
func ValidatePermits(n int) error {
	if n <= 0 || n > MaxPermits {
		return fmt.Errorf("%w: %d (want 1..%d)", ErrInvalidPermits, n, MaxPermits)
	}
	return nil
}

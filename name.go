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
		return fmt.Errorf("%w: %q is %d bytes, longer than %d", ErrInvalidName, shorten(name), len(name), MaxNameLen)
	}
	for i, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		case (r == '-' || r == '_') && i > 0:
		case r == '-' || r == '_':
			return fmt.Errorf("%w: %q starts with %q: the first character must be a letter or digit", ErrInvalidName, name, r)
		default:
			return fmt.Errorf("%w: %q: character %q at byte %d is not an ASCII letter, digit, '-' or '_'", ErrInvalidName, name, r, i)
		}
	}
	return nil
}

// shorten cuts a long name for a message: its first 24 and last 8
// characters.
func shorten(name string) string {
	r := []rune(name)
	if len(r) <= 40 {
		return name
	}
	return string(r[:24]) + "…" + string(r[len(r)-8:])
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

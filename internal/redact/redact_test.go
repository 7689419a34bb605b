package redact

import "testing"

func TestURL(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"amqp://guest:secret@127.0.0.1:5672/", "amqp://guest:xxxxx@127.0.0.1:5672/"},
		{"nats://127.0.0.1:4222", "nats://127.0.0.1:4222"},
		{"amqp://user@host/", "amqp://user@host/"},
		{"amqp://a:p1@h1:5672/,amqp://b:p2@h2:5672/", "amqp://a:xxxxx@h1:5672/,amqp://b:xxxxx@h2:5672/"},
		// A URL that does not parse still loses its password.
		{"amqp://u:p%zz@host/", "amqp://u:xxxxx@host/"},
		{"no url at all", "no url at all"},
	} {
		if got := URL(tc.in); got != tc.want {
			t.Errorf("URL(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

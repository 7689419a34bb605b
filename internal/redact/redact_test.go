package redact

import (
	"slices"
	"testing"
)

func TestURL(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"amqp://guest:secret@127.0.0.1:5672/", "amqp://guest:xxxxx@127.0.0.1:5672/"},
		{"nats://127.0.0.1:4222", "nats://127.0.0.1:4222"},
		{"amqp://user@host/", "amqp://user@host/"},
		{"amqp://a:p1@h1:5672/,amqp://b:p2@h2:5672/", "amqp://a:xxxxx@h1:5672/,amqp://b:xxxxx@h2:5672/"},
		// A URL that does not parse still loses its password.
		{"amqp://u:p%zz@host/", "amqp://u:xxxxx@host/"},
		{"no url at all", "no url at all"},
		// nats.go reads a lone userinfo as a token.
		{"nats://SECRETTOKEN123@127.0.0.1:4222", "nats://xxxxx@127.0.0.1:4222"},
		{"tls://SECRETTOKEN123@host:4222", "tls://xxxxx@host:4222"},
		{"NATS://SECRETTOKEN123@host:4222", "NATS://xxxxx@host:4222"},
		{"nats://tok@h1:4222,nats://tok@h2:4222", "nats://xxxxx@h1:4222,nats://xxxxx@h2:4222"},
		{"nats://tok@127.0.0.1:port", "nats://xxxxx@127.0.0.1:port"},
		{"nats://user:pw@host:4222", "nats://user:xxxxx@host:4222"},
		// A password with an unescaped @ or : is hidden whole.
		{"amqp://u:p@ss:w@host/", "amqp://u:xxxxx@host/"},
		// An @ in the path is not userinfo.
		{"amqp://host/v@host", "amqp://host/v@host"},
		// Credentials in query parameters.
		{"amqps://u:p@host/?auth_mechanism=PLAIN&password=hunter2&heartbeat=5",
			"amqps://u:xxxxx@host/?auth_mechanism=xxxxx&password=xxxxx&heartbeat=5"},
		{"nats://host:4222?token=abc#frag", "nats://host:4222?token=xxxxx#frag"},
		{"https://host/x?access_token=abc&X-Amz-Signature=def&a=b", "https://host/x?access_token=xxxxx&X-Amz-Signature=xxxxx&a=b"},
	} {
		if got := URL(tc.in); got != tc.want {
			t.Errorf("URL(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestText(t *testing.T) {
	seed := "SUAIBDPBAUTWCWBKIO6XHQNINK5FWJW4OHLXC3HQ2KFE4PEJUA44CNHTC4"
	jwt := "eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.eyJqdGkiOiJBQkMifQ.c2lnbmF0dXJl"
	for _, tc := range []struct {
		name, in string
		secrets  []string
		want     string
	}{
		{"nats error", "nats://SECRETTOKEN123@127.0.0.1:4222: nats: Authorization Violation", nil,
			"nats://xxxxx@127.0.0.1:4222: nats: Authorization Violation"},
		{"quoted", `parse "amqp://u:p%zz@host/": invalid URL escape "%zz"`, nil,
			`parse "amqp://u:xxxxx@host/": invalid URL escape "%zz"`},
		{"two urls", "dial amqp://a:b@h1/ then nats://t@h2:1 failed", nil,
			"dial amqp://a:xxxxx@h1/ then nats://xxxxx@h2:1 failed"},
		{"seed", "bad seed " + seed + " here", nil, "bad seed xxxxx here"},
		{"jwt", "jwt " + jwt + ".", nil, "jwt xxxxx."},
		{"known secret", "server said: token hunter22 refused", []string{"hunter22", "", "abc"}, "server said: token xxxxx refused"},
		{"short secret kept", "the abc", []string{"abc"}, "the abc"},
		{"plain", "nothing secret: 127.0.0.1:4222", nil, "nothing secret: 127.0.0.1:4222"},
	} {
		if got := Text(tc.in, tc.secrets...); got != tc.want {
			t.Errorf("%s: Text(%q) = %q, want %q", tc.name, tc.in, got, tc.want)
		}
	}
}

func TestSecrets(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"nats://127.0.0.1:4222", nil},
		{"amqp://user@host/", nil},
		{"amqp://guest:p%40ss@host/", []string{"p%40ss", "p@ss"}},
		{"nats://tok1@h1,nats://tok2@h2", []string{"tok1", "tok1", "tok2", "tok2"}},
		{"amqps://host/?password=a%2Bb&x=y", []string{"a%2Bb", "a+b"}},
	} {
		if got := Secrets(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("Secrets(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestStrip(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"amqp://guest:secret@127.0.0.1:5672/", "amqp://guest@127.0.0.1:5672/"},
		{"amqp://user@host/", "amqp://user@host/"},
		{"nats://127.0.0.1:4222", "nats://127.0.0.1:4222"},
		{"nats://SECRETTOKEN123@127.0.0.1:4222", "nats://127.0.0.1:4222"},
		{"nats://alice:pw@h1:4222,nats://alice:pw@h2:4222", "nats://h1:4222,nats://h2:4222"},
		{"amqps://u:p%zz@host/vh?password=x&heartbeat=5#f", "amqps://u@host/vh?heartbeat=5#f"},
		{"amqps://host/?token=x", "amqps://host/"},
		{"not a url", "not a url"},
	} {
		if got := Strip(tc.in); got != tc.want {
			t.Errorf("Strip(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

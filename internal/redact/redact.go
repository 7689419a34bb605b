// Package redact hides the passwords of broker URLs in messages. The
// libraries, the CLI and the bench harness all print URLs through it, so a
// password looks the same ("xxxxx", as net/url writes it) wherever it is
// hidden.
package redact

import (
	"net/url"
	"strings"
)

// URL hides the password of a URL, also of one that does not parse, and of
// each URL of a comma-separated list.
func URL(raw string) string {
	if parts := strings.Split(raw, ","); len(parts) > 1 {
		for i, p := range parts {
			parts[i] = URL(p)
		}
		return strings.Join(parts, ",")
	}
	if u, err := url.Parse(raw); err == nil {
		if _, hasPass := u.User.Password(); !hasPass {
			return raw
		}
		return u.Redacted()
	}
	scheme, rest, ok := strings.Cut(raw, "://")
	if i := strings.LastIndex(rest, "@"); ok && i >= 0 {
		if user, _, hasPass := strings.Cut(rest[:i], ":"); hasPass {
			return scheme + "://" + user + ":xxxxx" + rest[i:]
		}
	}
	return raw
}

// Package redact hides the credentials of broker URLs in messages. The
// libraries, the CLI and the bench harness all print URLs through it, so a
// credential looks the same ("xxxxx", as net/url writes a password)
// wherever it is hidden.
//
// A URL's credentials are its password; its userinfo when that has no
// password and the scheme is not amqp:// or amqps:// (nats.go reads
// nats://TOKEN@host as a token); and the values of query parameters whose
// names say they are secret (password, token, secret, key, seed, jwt,
// creds...). amqp://user@host keeps its user name: RabbitMQ has no token
// form, and the name says which user the broker refused.
package redact

import (
	"net/url"
	"regexp"
	"strings"
)

// Mask replaces every credential.
const Mask = "xxxxx"

// MinSecretLen is the shortest secret Text replaces wherever it appears:
// shorter strings cannot be told from ordinary words (a 3-letter password
// would mask every "the"). Credentials inside URLs are masked whatever
// their length.
const MinSecretLen = 4

// URL hides the credentials of a URL, also of one that does not parse, and
// of each URL of a comma-separated list.
func URL(raw string) string {
	if parts := strings.Split(raw, ","); len(parts) > 1 {
		for i, p := range parts {
			parts[i] = URL(p)
		}
		return strings.Join(parts, ",")
	}
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return raw
	}
	// The userinfo ends at the last @ before the path, query or fragment
	// (as net/url reads it; a password may hold an unescaped @).
	authEnd := len(rest)
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		authEnd = i
	}
	if i := strings.LastIndex(rest[:authEnd], "@"); i >= 0 {
		if user, _, hasPass := strings.Cut(rest[:i], ":"); hasPass {
			rest = user + ":" + Mask + rest[i:]
		} else if !keepsLoneUser(scheme) {
			rest = Mask + rest[i:]
		}
	}
	// Query parameters that carry secrets.
	if q := strings.IndexByte(rest, '?'); q >= 0 {
		query, frag, hasFrag := strings.Cut(rest[q+1:], "#")
		query = maskQuery(query)
		rest = rest[:q+1] + query
		if hasFrag {
			rest += "#" + frag
		}
	}
	return scheme + "://" + rest
}

// keepsLoneUser reports whether a URL of scheme reads a userinfo without a
// password as a user name (not secret) rather than as a token.
func keepsLoneUser(scheme string) bool {
	switch strings.ToLower(scheme) {
	case "amqp", "amqps":
		return true
	}
	return false
}

// maskQuery hides the values of the secret parameters of a raw query.
func maskQuery(query string) string {
	params := strings.Split(query, "&")
	for i, p := range params {
		k, _, hasValue := strings.Cut(p, "=")
		if !hasValue {
			continue
		}
		if name, err := url.QueryUnescape(k); err == nil && secretParam(name) {
			params[i] = k + "=" + Mask
		} else if err != nil && secretParam(k) {
			params[i] = k + "=" + Mask
		}
	}
	return strings.Join(params, "&")
}

// secretWords mark a query parameter whose value is a credential.
var secretWords = []string{"pass", "pwd", "token", "secret", "key", "seed", "jwt", "cred", "auth", "sig", "nkey"}

func secretParam(name string) bool {
	name = strings.ToLower(name)
	for _, w := range secretWords {
		if strings.Contains(name, w) {
			return true
		}
	}
	return false
}

var (
	// urlRE finds URLs in free text: a scheme, ://, and everything up to
	// white space or a quote.
	urlRE = regexp.MustCompile("[A-Za-z][A-Za-z0-9+.-]*://[^\\s\"'`<>]+")
	// seedRE finds NATS nkey seeds: 'S', the key type, then base32 to 58
	// characters.
	seedRE = regexp.MustCompile(`\bS[OACUNXP][A-Z2-7]{56}\b`)
	// jwtRE finds JWTs (a NATS user JWT may be a bearer token).
	jwtRE = regexp.MustCompile(`\beyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}`)
)

// Text hides the credentials of every URL in free text s (an error
// message, a log line), NATS nkey seeds and JWTs, and every occurrence of
// each of secrets at least MinSecretLen long: the credentials a program
// was given, whatever quotes them.
func Text(s string, secrets ...string) string {
	s = urlRE.ReplaceAllStringFunc(s, URL)
	s = seedRE.ReplaceAllLiteralString(s, Mask)
	s = jwtRE.ReplaceAllLiteralString(s, Mask)
	for _, sec := range secrets {
		if len(sec) >= MinSecretLen {
			s = strings.ReplaceAll(s, sec, Mask)
		}
	}
	return s
}

// Secrets returns the credentials in raw, a URL or a comma-separated list
// of them, as given and unescaped: the strings Text should also hide
// wherever something quotes them without the URL around them.
func Secrets(raw string) []string {
	var out []string
	add := func(vs ...string) {
		for _, v := range vs {
			if v != "" {
				out = append(out, v)
			}
		}
	}
	for _, part := range strings.Split(raw, ",") {
		scheme, rest, ok := strings.Cut(strings.TrimSpace(part), "://")
		if !ok {
			continue
		}
		authEnd := len(rest)
		if i := strings.IndexAny(rest, "/?#"); i >= 0 {
			authEnd = i
		}
		if i := strings.LastIndex(rest[:authEnd], "@"); i >= 0 {
			user, pass, hasPass := strings.Cut(rest[:i], ":")
			switch {
			case hasPass:
				p, _ := url.PathUnescape(pass)
				add(pass, p)
			case !keepsLoneUser(scheme):
				u, _ := url.PathUnescape(user)
				add(user, u)
			}
		}
		if _, query, ok := strings.Cut(rest, "?"); ok {
			query, _, _ = strings.Cut(query, "#")
			for p := range strings.SplitSeq(query, "&") {
				k, v, _ := strings.Cut(p, "=")
				if name, err := url.QueryUnescape(k); (err == nil && secretParam(name)) || secretParam(k) {
					uv, _ := url.QueryUnescape(v)
					add(v, uv)
				}
			}
		}
	}
	return out
}

// Strip removes from raw, a URL or a comma-separated list of them, the
// credentials URL would mask, for a URL handed on to a program that must
// not have them. An amqp:// URL keeps its user name; any other loses its
// whole userinfo (nats.go would read a user name left alone as a token).
func Strip(raw string) string {
	parts := strings.Split(raw, ",")
	for i, part := range parts {
		scheme, rest, ok := strings.Cut(part, "://")
		if !ok {
			continue
		}
		authEnd := len(rest)
		if j := strings.IndexAny(rest, "/?#"); j >= 0 {
			authEnd = j
		}
		if j := strings.LastIndex(rest[:authEnd], "@"); j >= 0 {
			user, _, _ := strings.Cut(rest[:j], ":")
			if keepsLoneUser(scheme) && user != "" {
				rest = user + rest[j:]
			} else {
				rest = rest[j+1:]
			}
		}
		if q := strings.IndexByte(rest, '?'); q >= 0 {
			query, frag, hasFrag := strings.Cut(rest[q+1:], "#")
			var kept []string
			for p := range strings.SplitSeq(query, "&") {
				k, _, _ := strings.Cut(p, "=")
				if name, err := url.QueryUnescape(k); !secretParam(k) && (err != nil || !secretParam(name)) {
					kept = append(kept, p)
				}
			}
			rest = rest[:q]
			if len(kept) > 0 {
				rest += "?" + strings.Join(kept, "&")
			}
			if hasFrag {
				rest += "#" + frag
			}
		}
		parts[i] = scheme + "://" + rest
	}
	return strings.Join(parts, ",")
}

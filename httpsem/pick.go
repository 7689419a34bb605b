package httpsem

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/semgroup"
)

// ErrNoKey is returned by a key function (see Header) for a request that
// does not name its key. The default error handler answers it 400.
var ErrNoKey = errors.New("httpsem: request has no key")

// Picker returns the semaphore that gates r. Its error is answered by the
// error handler (see WithErrorHandler) without acquiring anything.
type Picker func(r *http.Request) (tokensem.Semaphore, error)

// Fixed gates every request with s.
func Fixed(s tokensem.Semaphore) Picker {
	return func(*http.Request) (tokensem.Semaphore, error) { return s, nil }
}

// ByKey gates each request with the semaphore of its key in g: key(r)
// names it (a tenant, an API key, a route). On a key's first use the
// semaphore is opened (g.Open) before the wait budget starts, so creating
// it never turns into a 429. A key g refuses is answered 400 by the
// default error handler, a failed open (a permit-count mismatch, an
// unreachable broker) 503.
func ByKey(g *semgroup.Group, key func(r *http.Request) (string, error)) Picker {
	return func(r *http.Request) (tokensem.Semaphore, error) {
		k, err := key(r)
		if err != nil {
			return nil, err
		}
		if err := g.Open(r.Context(), k); err != nil {
			return nil, err
		}
		return g.For(k), nil
	}
}

// Header returns a key function that reads the request header name; a
// missing or empty header is ErrNoKey.
func Header(name string) func(r *http.Request) (string, error) {
	return func(r *http.Request) (string, error) {
		if k := r.Header.Get(name); k != "" {
			return k, nil
		}
		return "", fmt.Errorf("%w: header %s is missing", ErrNoKey, name)
	}
}

// Package stored bounds what the backends read back from a broker: every
// record they stored (a configuration, a slot or lock record, a registry
// entry) may have been written by someone else, at any size. A record
// longer than its cap is refused before it is parsed, and errors quote at
// most ClipLen bytes of it.
package stored

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/tokensem/tokensem"
)

// ClipLen is the most bytes of a record an error quotes.
const ClipLen = 32

// Decode unmarshals the JSON record b into v. A record longer than max is
// refused unparsed. Errors wrap tokensem.ErrInvalidRecord and quote at
// most ClipLen bytes of b.
func Decode(b []byte, max int, v any) error {
	if len(b) > max {
		return Invalid("%d bytes, more than the %d a record may have: %s", len(b), max, Clip(b))
	}
	if err := json.Unmarshal(b, v); err != nil {
		// A type error quotes the offending value (a number literal may
		// be the whole record): clipped too.
		return Invalid("not JSON of the expected shape (%s): %s", ClipString(err.Error(), 2*ClipLen), Clip(b))
	}
	return nil
}

// Invalid returns an error wrapping tokensem.ErrInvalidRecord that says
// what is wrong. Callers quote record contents only through Clip.
func Invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{tokensem.ErrInvalidRecord}, args...)...)
}

// Clip quotes b, cut to its first ClipLen bytes (and then saying how long
// it was).
func Clip(b []byte) string {
	if len(b) <= ClipLen {
		return strconv.Quote(string(b))
	}
	return strconv.Quote(string(b[:ClipLen])) + "… (" + strconv.Itoa(len(b)) + " bytes)"
}

// ClipString cuts s to its first n bytes, marking the cut.
func ClipString(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// Len checks that a string field of a record is at most max bytes long.
func Len(field, s string, max int) error {
	if len(s) > max {
		return Invalid("%s is %d bytes, more than %d: %s", field, len(s), max, Clip([]byte(s)))
	}
	return nil
}

// Encode returns the JSON of v as a record is stored: <, > and & as
// themselves (the standard encoder writes each as six bytes, so a record
// written back would grow past the bound it was checked against), with no
// trailing newline.
func Encode(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

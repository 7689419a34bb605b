package adaptive

import (
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/internal/stored"
)

// Record is what the leading controller of a semaphore keeps beside it, for
// operators (seminit status): who leads, within what range, and its latest
// changes of the count. A backend stores it with RecordController and
// reads it back with ControllerRecord; it is informational only: nothing
// admits or resizes by it, and whoever may resize the semaphore may write
// it.
type Record struct {
	By        string    `json:"by"`     // the leading controller, such as "seminit adapt on host (pid 12)"
	Leader    string    `json:"leader"` // the one-permit semaphore whose holder leads
	Min       int       `json:"min"`    // the range the controller keeps the count in
	Max       int       `json:"max"`
	Algorithm string    `json:"algorithm,omitempty"`
	Since     time.Time `json:"since"`             // when By began to lead
	At        time.Time `json:"at"`                // when By wrote the record
	Changes   []Change  `json:"changes,omitempty"` // the latest changes, oldest first: at most MaxChanges
}

// Change is one change of the count a controller made, or tried.
type Change struct {
	At   time.Time `json:"at"`
	From int       `json:"from"`
	To   int       `json:"to"`            // the count after it (a failed resize: the count read back)
	Why  string    `json:"why,omitempty"` // what the window showed, or why the resize failed
}

// Bounds of a Record: a record beyond them is not written, and one read
// back beyond them is refused (it may have been written by anyone with
// the semaphore's admin rights, at any size).
const (
	// MaxChanges is how many changes a Record keeps: Add drops the oldest.
	MaxChanges = 8
	// MaxRecordLen bounds an encoded Record: one at every bound, of the
	// characters JSON escapes longest, fits.
	MaxRecordLen = 4096

	maxByLen        = 96
	maxAlgorithmLen = 16
	maxWhyLen       = 96
)

// Add returns r with c as its latest change, keeping the last MaxChanges;
// a Why longer than a record allows is cut (see Clip).
func (r Record) Add(c Change) Record {
	c.Why = Clip(c.Why, maxWhyLen)
	changes := append(append([]Change(nil), r.Changes...), c)
	r.Changes = changes[max(0, len(changes)-MaxChanges):]
	return r
}

// Clip returns s as valid UTF-8 (each run of invalid bytes becomes U+FFFD,
// as JSON would write it) without control characters (each becomes a
// space), of at most n bytes, cut at a character and ending in "…" when
// cut: how a Record's text fields are made to fit.
func Clip(s string, n int) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' ' // JSON writes most as six bytes
		}
		return r
	}, strings.ToValidUTF8(s, "\uFFFD"))
	if len(s) <= n {
		return s
	}
	const more = "…"
	cut := max(0, n-len(more))
	for cut > 0 && !utf8.RuneStart(s[cut]) { // not inside a character
		cut--
	}
	return s[:cut] + more
}

// Check reports what is wrong with r, wrapping tokensem.ErrInvalidRecord.
func (r Record) Check() error {
	count := func(n int) bool { return n >= 1 && n <= tokensem.MaxPermits }
	switch {
	case r.By == "":
		return stored.Invalid("a controller record names no controller")
	case tokensem.ValidateName(r.Leader) != nil:
		return stored.Invalid("a controller record names the leader semaphore %s", stored.Clip([]byte(r.Leader)))
	case !count(r.Min) || !count(r.Max) || r.Min > r.Max:
		return stored.Invalid("a controller record's range %d..%d", r.Min, r.Max)
	case len(r.Changes) > MaxChanges:
		return stored.Invalid("a controller record of %d changes (at most %d)", len(r.Changes), MaxChanges)
	}
	if err := checkText("a controller record's by", r.By, maxByLen); err != nil {
		return err
	}
	if err := checkText("a controller record's algorithm", r.Algorithm, maxAlgorithmLen); err != nil {
		return err
	}
	for _, c := range r.Changes {
		if !count(c.From) || !count(c.To) {
			return stored.Invalid("a controller record's change %d → %d", c.From, c.To)
		}
		if err := checkText("a change's why", c.Why, maxWhyLen); err != nil {
			return err
		}
	}
	return nil
}

// checkText checks a text field of a record: at most max bytes, UTF-8
// without control characters (Clip makes it so). JSON writes each invalid
// byte as U+FFFD, three bytes, and most control characters as six: other
// text would not fit its bounds both ways.
func checkText(field, s string, max int) error {
	if err := stored.Len(field, s, max); err != nil {
		return err
	}
	if !utf8.ValidString(s) || strings.IndexFunc(s, unicode.IsControl) >= 0 {
		return stored.Invalid("%s %s is not UTF-8 without control characters", field, stored.Clip([]byte(s)))
	}
	return nil
}

// EncodeRecord returns r as a backend stores it. Errors wrap
// tokensem.ErrInvalidOption: r fails Check.
func EncodeRecord(r Record) ([]byte, error) {
	if err := r.Check(); err != nil {
		return nil, fmt.Errorf("%w: %w", tokensem.ErrInvalidOption, err)
	}
	b, err := stored.Encode(r)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", tokensem.ErrInvalidOption, err)
	}
	if len(b) > MaxRecordLen { // not within Check's bounds (see MaxRecordLen)
		return nil, fmt.Errorf("%w: a controller record of %d bytes (at most %d)", tokensem.ErrInvalidOption, len(b), MaxRecordLen)
	}
	return b, nil
}

// DecodeRecord parses a record a backend stored. Errors wrap
// tokensem.ErrInvalidRecord: too long, malformed, or out of bounds.
func DecodeRecord(b []byte) (Record, error) {
	var r Record
	if err := stored.Decode(b, MaxRecordLen, &r); err != nil {
		return Record{}, err
	}
	if err := r.Check(); err != nil {
		return Record{}, err
	}
	return r, nil
}

package driver

import (
	"errors"
	"fmt"

	"github.com/tokensem/tokensem"
)

// Classify parses one token message against a semaphore's current
// definition and returns its Entry (Ref and Held left for the caller): a
// valid token, or the reason it is not one — "forged" (bad or missing
// signature under the codec's key), "junk" (does not parse), "foreign" (of
// another semaphore) or "retired" (index >= permits, or another epoch).
func Classify(codec Codec, semaphore string, permits int, epoch uint64, data []byte) Entry {
	tok, err := codec.Decode(data)
	switch {
	case errors.Is(err, tokensem.ErrForgedToken):
		return Entry{Reason: "forged"}
	case err != nil:
		return Entry{Reason: "junk"}
	case tok.Semaphore != semaphore:
		return Entry{Token: tok, Reason: "foreign"}
	case tok.Epoch != epoch || tok.Index >= permits:
		return Entry{Token: tok, Reason: "retired"}
	default:
		return Entry{Token: tok, Valid: true}
	}
}

// Admit checks a token delivered to an acquirer, as Classify does, but
// checks a token that looks retired once more against a definition read
// afresh: a resize may have grown the semaphore since the caller's copy was
// read, and a token discarded for that would be lost. def returns the
// semaphore's permits and epoch, re-read from the broker when fresh is
// set. It returns the token when it is a current one, an error wrapping
// ErrNotCurrent with the reason when it is not, or def's error.
func Admit(codec Codec, semaphore string, data []byte, def func(fresh bool) (permits int, epoch uint64, err error)) (tokensem.Token, error) {
	permits, epoch, err := def(false)
	if err != nil {
		return tokensem.Token{}, err
	}
	e := Classify(codec, semaphore, permits, epoch, data)
	if e.Reason == "retired" {
		if permits, epoch, err = def(true); err != nil {
			return tokensem.Token{}, err
		}
		e = Classify(codec, semaphore, permits, epoch, data)
	}
	if !e.Valid {
		return tokensem.Token{}, fmt.Errorf("%w: %s token %s", ErrNotCurrent, e.Reason, e.Token)
	}
	return e.Token, nil
}

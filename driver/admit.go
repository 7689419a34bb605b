package driver

import (
	"errors"
	"fmt"
	"time"

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

// Admit is the admission rule every backend applies to a delivered token
// before it claims the token's slot, C being the backend's configuration.
// judge classifies the token against a configuration (as Classify does,
// plus any rule of the backend's own); cached returns the configuration at
// hand, read returns one read from the broker. A token that looks retired
// under the cached configuration is judged once more against one read
// afresh: a resize may have grown the semaphore, a repair named the token
// current, or a new life of the semaphore begun since the cached copy was
// read, and a token discarded for that would be lost. Admit returns the
// token and the configuration that admitted it, an error wrapping
// ErrNotCurrent with the reason when the token is not a current one, or
// the error of a read.
func Admit[C any](cached, read func() (C, error), judge func(C) Entry) (tokensem.Token, C, error) {
	var none C
	cfg, err := cached()
	if err != nil {
		return tokensem.Token{}, none, err
	}
	e := judge(cfg)
	if e.Reason == "retired" {
		if cfg, err = read(); err != nil {
			return tokensem.Token{}, none, err
		}
		e = judge(cfg)
	}
	if !e.Valid {
		return tokensem.Token{}, none, fmt.Errorf("%w: %s token %s", ErrNotCurrent, e.Reason, e.Token)
	}
	return e.Token, cfg, nil
}

// ConfigTTL is how long an acquirer may admit tokens by a configuration it
// read, counted from when its read began: every client of a semaphore
// admits by a configuration written at time t from t + ConfigTTL on (a
// resize's permit count, a repair's current token of a slot). Resize and
// repair rest on it; a backend may trust a configuration longer only on
// proof that it has not changed (natssem's group generation).
const ConfigTTL = 2 * time.Second

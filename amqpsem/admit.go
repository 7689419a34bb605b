package amqpsem

import (
	"context"
	"fmt"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/driver"
)

// admit checks a delivered token against the configuration, as
// driver.Admit does, and against its slot's current token (see
// classify): a token that is not a current one of this semaphore is an
// error wrapping driver.ErrNotCurrent. One that looks retired is
// checked again against the configuration read afresh: a resize may have
// grown the semaphore, a repair named it current, or it belongs to a new
// life of the semaphore (a new epoch), which only the configuration of its
// own life may admit. It returns the configuration it checked against.
func (s *Semaphore) admit(ctx context.Context, body []byte) (tokensem.Token, config, error) {
	cfg, err := s.freshConfig(ctx)
	if err != nil {
		return tokensem.Token{}, config{}, err
	}
	e := s.classify(cfg, body)
	if e.Reason == "retired" {
		if cfg, err = s.refreshConfig(ctx); err != nil {
			return tokensem.Token{}, config{}, err
		}
		e = s.classify(cfg, body)
	}
	if !e.Valid {
		return e.Token, config{}, fmt.Errorf("%w: %s token %s", driver.ErrNotCurrent, e.Reason, e.Token)
	}
	return e.Token, cfg, nil
}

// classify is driver.Classify with the slot's current token: a token
// of a reissued slot other than the one Reissued names is retired.
func (s *Semaphore) classify(cfg config, body []byte) driver.Entry {
	e := driver.Classify(s.codec, s.name, cfg.Permits, cfg.Epoch, body)
	if r, ok := cfg.Reissued[e.Token.Index]; ok && e.Valid && r.ID != e.Token.ID {
		e.Valid, e.Reason = false, "retired"
	}
	return e
}

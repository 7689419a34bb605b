package amqpsem

import (
	"context"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/driver"
)

// admit applies driver.Admit to a delivered token, judged by classify
// (the slot's current token too) against the cached configuration or,
// when it looks retired, one read afresh: only the configuration of its
// own life may admit it. It returns the token and the configuration it
// was admitted by, or an error wrapping driver.ErrNotCurrent.
func (s *Semaphore) admit(ctx context.Context, body []byte) (tokensem.Token, config, error) {
	return driver.Admit(
		func() (config, error) { return s.freshConfig(ctx) },
		func() (config, error) { return s.refreshConfig(ctx) },
		func(c config) driver.Entry { return s.classify(c, body) })
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

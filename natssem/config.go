package natssem

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/driver"
	"github.com/tokensem/tokensem/internal/ids"
	"github.com/tokensem/tokensem/internal/stored"
)

// configKey is the KV key of the configuration; slot records live beside
// it (see slotKey).
const configKey = "config"

// config is the semaphore's definition, stored under configKey. Every
// client reads it at Open; Init creates it exactly once.
type config struct {
	Version int           `json:"v"`
	Permits int           `json:"permits"`
	Lease   time.Duration `json:"lease_ns"`
	// Epoch names this life of the semaphore, from the Init that created
	// it to the Delete that ends it: a random number (ids.Epoch) no other
	// life of the name shares. Its tokens carry it and its slot records
	// name it, so that a client still holding an earlier life's
	// configuration cannot admit by it (see admit and claim).
	Epoch    uint64 `json:"epoch"`
	KeyCheck string `json:"key_check,omitempty"`
	// State is stateSeeding while the creator publishes the tokens,
	// stateReady afterwards, and stateDeleting while Delete runs (see
	// delete.go); Open refuses a semaphore that is not ready.
	State   string `json:"state"`
	Seeder  string `json:"seeder,omitempty"`
	Created int64  `json:"created_unix_ms"`
	// Deleting is when Delete marked the semaphore (client clock), for
	// whoever reads the bucket.
	Deleting int64 `json:"deleting_unix_ms,omitempty"`
	// Was is the state Delete found, put back if it refuses; empty on a
	// placeholder Delete wrote where there was no configuration yet.
	Was string `json:"was,omitempty"`
	// PriorityGroup is the token consumer's priority group when the
	// consumer serves pulls by class (the "prioritized" policy, nats-server
	// 2.12 and later), empty when it serves them in arrival order only:
	// pulls name it, and a wait in a class other than 0 needs it.
	PriorityGroup string `json:"priority_group,omitempty"`

	// gen is the group's generation read before this configuration was,
	// if genKnown (see generation.go); not stored.
	gen      genValue
	genKnown bool
}

// Configuration versions. A key of a group made since the group's
// generation (generation.go) has configVersionGen: every change of its
// count, and its removal, bumps the generation. Clients of earlier
// versions neither bump nor read the generation; they refuse such a
// configuration as unsupported rather than change it unseen.
const (
	configVersion    = 1
	configVersionGen = 2
)

const (
	stateSeeding  = "seeding"
	stateReady    = "ready"
	stateDeleting = "deleting"
)

func (c config) encode() []byte { return mustMarshal(c) }

// maxConfigSize caps a stored configuration: the largest this package
// writes is a few hundred bytes. A larger record is refused unparsed.
const maxConfigSize = 4 << 10

// decodeConfig parses and checks a stored configuration (see the package
// doc, "What is read is checked"). Errors wrap tokensem.ErrInvalidRecord.
func decodeConfig(b []byte) (config, error) {
	var c config
	if err := stored.Decode(b, maxConfigSize, &c); err != nil {
		return config{}, err
	}
	if err := c.check(); err != nil {
		return config{}, fmt.Errorf("%w: %s", err, stored.Clip(b))
	}
	return c, nil
}

// check checks the fields of a configuration read back.
func (c config) check() error {
	switch {
	case c.Version != configVersion && c.Version != configVersionGen:
		return stored.Invalid("version %d (this client reads %d and %d)", c.Version, configVersion, configVersionGen)
	case c.Permits <= 0 || c.Permits > tokensem.MaxPermits:
		return stored.Invalid("permits %d outside 1..%d", c.Permits, tokensem.MaxPermits)
	case c.Lease < tokensem.MinLease || c.Lease > tokensem.MaxLease:
		return stored.Invalid("lease %v outside [%v, %v]", c.Lease, tokensem.MinLease, tokensem.MaxLease)
	case c.Epoch == 0 || c.Epoch >= ids.MaxEpoch:
		return stored.Invalid("epoch %d outside 1..2^53-1", c.Epoch)
	case c.State != stateSeeding && c.State != stateReady && c.State != stateDeleting:
		return stored.Invalid("state %s", stored.Clip([]byte(c.State)))
	case c.Was != "" && c.Was != stateSeeding && c.Was != stateReady:
		return stored.Invalid("earlier state %s", stored.Clip([]byte(c.Was)))
	case c.PriorityGroup != "" && c.PriorityGroup != priorityGroup:
		return stored.Invalid("priority group %s (this client names %s)", stored.Clip([]byte(c.PriorityGroup)), priorityGroup)
	}
	if err := stored.Len("key_check", c.KeyCheck, 64); err != nil {
		return err
	}
	return stored.Len("seeder", c.Seeder, 64)
}

// readConfig reads the configuration and its revision from the bucket's
// stream leader (readLast).
func (s *Semaphore) readConfig(ctx context.Context) (config, uint64, error) {
	data, seq, err := s.readLast(ctx, s.lay.key(configKey))
	switch {
	case errors.Is(err, errNoRecord):
		return config{}, 0, fmt.Errorf("%w: %s has no configuration", tokensem.ErrNotInitialized, s.name)
	case err != nil:
		return config{}, 0, wrapBrokerErr(fmt.Errorf("reading the configuration of %s: %w", s.name, err))
	}
	cfg, err := decodeConfig(data)
	if err != nil {
		return config{}, seq, invalidConfig(s.name, err)
	}
	return cfg, seq, nil
}

// invalidConfig says that semaphore name's configuration is invalid (err
// wraps tokensem.ErrInvalidRecord), and what removes it.
func invalidConfig(name string, err error) error {
	return fmt.Errorf("natssem: the configuration of %s cannot be used (ForceDelete, or seminit delete --force, removes the semaphore): %w", name, err)
}

func (s *Semaphore) config() config { return s.cfg.Get() }

// refreshConfig re-reads the configuration (it changes on resize).
func (s *Semaphore) refreshConfig(ctx context.Context) (config, error) {
	return s.cfg.Refresh(ctx, s.readCurrentConfig)
}

func (s *Semaphore) setConfig(cfg config) { s.cfg.Set(cfg) }

// configTTL is how long an acquirer trusts the configuration it read
// (driver.ConfigTTL). A key of a group trusts it longer while the group's
// generation vouches for it (generation.go).
const configTTL = driver.ConfigTTL

// cachedConfig returns the cached configuration, its age, and whether the
// group's generation may vouch for it at that age (the one place that
// decides it: vouchable, and younger than configMaxAge).
func (s *Semaphore) cachedConfig() (cfg config, age time.Duration, byGen bool) {
	cfg, at := s.cfg.GetAt()
	age = time.Since(at)
	return cfg, age, s.group != nil && cfg.vouchable() && age < configMaxAge
}

// readCurrentConfig reads the configuration; of a key whose changes bump
// its group's generation, it notes the generation read before it.
func (s *Semaphore) readCurrentConfig(ctx context.Context) (config, error) {
	var (
		g     genValue
		noted bool
	)
	if s.group != nil {
		var err error
		g, err = s.group.gen.Fresh(ctx, configTTL, s.readGeneration)
		noted = err == nil && g.bumped()
	}
	cfg, _, err := s.readConfig(ctx)
	if err == nil && noted && cfg.Version >= configVersionGen {
		cfg.gen, cfg.genKnown = g, true
	}
	return cfg, err
}

// freshConfig returns the configuration an acquirer may admit by: the
// cached one while it is younger than configTTL or its group's generation
// vouches for it, else one read now.
func (s *Semaphore) freshConfig(ctx context.Context) (config, error) {
	if cfg, ok := s.byGeneration(ctx); ok {
		return cfg, nil
	}
	return s.cfg.Fresh(ctx, configTTL, s.readCurrentConfig)
}

// prefetchConfig starts, beside an Acquire's pull, the read freshConfig
// will need: none while the cached configuration is fresh or vouched for
// by a generation read within configTTL; the generation when it is due
// (it will most likely vouch); else the configuration. Call stop before
// returning.
func (s *Semaphore) prefetchConfig(ctx context.Context) (stop func()) {
	cfg, age, byGen := s.cachedConfig()
	if age < configTTL {
		return func() {}
	}
	if byGen {
		g, gat := s.group.gen.GetAt()
		switch {
		case time.Since(gat) >= configTTL:
			return s.group.gen.Prefetch(ctx, configTTL, s.readGeneration)
		case g == cfg.gen:
			return func() {}
		}
	}
	return s.cfg.Prefetch(ctx, configTTL, s.readCurrentConfig)
}

// updateConfig writes cfg over the configuration at rev, returning the
// new revision.
func (s *Semaphore) updateConfig(ctx context.Context, cfg config, rev uint64) (uint64, error) {
	rctx, cancel := s.rtt(ctx)
	defer cancel()
	nrev, err := s.kv.Update(rctx, s.lay.key(configKey), cfg.encode(), rev)
	if err != nil {
		return 0, wrapBrokerErr(err)
	}
	return nrev, nil
}

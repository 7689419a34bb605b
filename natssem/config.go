package natssem

import (
	"encoding/json"
	"fmt"
	"time"
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

func decodeConfig(b []byte) (config, error) {
	var c config
	if err := json.Unmarshal(b, &c); err != nil {
		return config{}, fmt.Errorf("natssem: corrupt config record: %w", err)
	}
	if (c.Version != configVersion && c.Version != configVersionGen) || c.Permits <= 0 || c.Lease <= 0 || c.Epoch == 0 {
		return config{}, fmt.Errorf("natssem: unsupported config record %q", b)
	}
	return c, nil
}

package natssem

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"
)

// KV keys of a semaphore's bucket.
const (
	configKey  = "config"
	slotPrefix = "slot."
)

func slotKey(index int) string { return slotPrefix + strconv.Itoa(index) }

// config is the semaphore's definition, stored under configKey. Every
// client reads it at Open; Init creates it exactly once.
type config struct {
	Version  int           `json:"v"`
	Permits  int           `json:"permits"`
	Lease    time.Duration `json:"lease_ns"`
	Epoch    uint64        `json:"epoch"`
	KeyCheck string        `json:"key_check,omitempty"`
	// State is stateSeeding while the creator publishes the tokens and
	// stateReady afterwards; Open refuses a semaphore that is not ready.
	State   string `json:"state"`
	Seeder  string `json:"seeder,omitempty"`
	Created int64  `json:"created_unix_ms"`
}

const (
	configVersion = 1
	stateSeeding  = "seeding"
	stateReady    = "ready"
)

func decodeConfig(b []byte) (config, error) {
	var c config
	if err := json.Unmarshal(b, &c); err != nil {
		return config{}, fmt.Errorf("natssem: corrupt config record: %w", err)
	}
	if c.Version != configVersion || c.Permits <= 0 || c.Lease <= 0 || c.Epoch == 0 {
		return config{}, fmt.Errorf("natssem: unsupported config record %q", b)
	}
	return c, nil
}

// record is a slot's lease record, stored under slotKey(index). It, not the
// token delivery, decides who holds the slot: a delivery becomes a permit
// only by a compare-and-set of this record, and its KV revision is the
// fencing number. Holder is empty when the slot is free.
type record struct {
	Holder string `json:"h,omitempty"` // unique id of the holding acquire
	Owner  string `json:"o,omitempty"` // holder's name, for Status
	Seq    uint64 `json:"seq"`         // stream sequence of the held (or last held) token
	Token  string `json:"tok,omitempty"`
	By     string `json:"by,omitempty"` // on a free record: the holder that released it
}

func (r record) free() bool { return r.Holder == "" }

func (r record) encode() []byte {
	b, err := json.Marshal(r)
	if err != nil {
		panic(err) // a struct of strings and ints always marshals
	}
	return b
}

func decodeRecord(b []byte) (record, error) {
	var r record
	if len(b) == 0 {
		return r, nil
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return record{}, fmt.Errorf("natssem: corrupt slot record: %w", err)
	}
	return r, nil
}

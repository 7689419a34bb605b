// Package ids makes the random identifiers tokensem uses: token ids,
// holder ids, consumer tags, and the epoch that names a semaphore's life.
package ids

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
)

// New returns 128 random bits as 32 lowercase hex digits.
func New() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (it crashes the program instead)
	return hex.EncodeToString(b[:])
}

// MaxEpoch bounds Epoch: epochs stay below 2^53, so that they survive a
// trip through JSON readers that hold numbers as float64 (JavaScript's).
const MaxEpoch = 1 << 53

// Epoch returns a random epoch in [1, MaxEpoch): the identity of one life
// of a semaphore (from an Init to its Delete). Two lives of one name share
// an epoch with probability 2^-53.
func Epoch() uint64 {
	var b [8]byte
	for {
		_, _ = rand.Read(b[:])
		if e := binary.BigEndian.Uint64(b[:]) % MaxEpoch; e != 0 {
			return e
		}
	}
}

// Valid reports whether s is an id New made: 32 lowercase hex digits.
func Valid(s string) bool {
	if len(s) != 32 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

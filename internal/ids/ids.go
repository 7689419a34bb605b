// Package ids makes the random identifiers tokensem uses: token ids,
// holder ids, consumer tags.
package ids

import (
	"crypto/rand"
	"encoding/hex"
)

// New returns 128 random bits as 32 lowercase hex digits.
func New() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (it crashes the program instead)
	return hex.EncodeToString(b[:])
}

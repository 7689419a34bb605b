package tokensem

import "fmt"

// A Token is one permit of a semaphore, stored as one broker message. The
// index is the token's identity: a healthy semaphore of N permits holds
// exactly one token for every index in [0, N). Two tokens with one index are
// duplicates; an index with no token is a loss.
type Token struct {
	Semaphore string // name of the semaphore the token belongs to
	Index     int    // slot, 0 <= Index < permits
	Epoch     uint64 // generation of the token set; older epochs are retired
	ID        string // unique per issued token (32 lowercase hex digits)
}

// String returns a short human form, "name[index]@epoch".
func (t Token) String() string {
	return fmt.Sprintf("%s[%d]@%d", t.Semaphore, t.Index, t.Epoch)
}

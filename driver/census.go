package driver

import (
	"slices"

	"github.com/tokensem/tokensem"
)

// Entry is one token message found by a census.
type Entry struct {
	Ref    string         // the backend's handle for Remove (NATS: stream sequence)
	Token  tokensem.Token // parsed token; zero when Valid is false and it did not parse
	Valid  bool           // a current token of this semaphore: parses, verifies, index < permits, current epoch
	Reason string         // why it is not valid: "junk", "forged", "foreign", "retired"
	Held   bool           // a live holder holds this very message (also a retired one: see Findings.Retiring)
}

// Census is what an Inventory found at one moment.
type Census struct {
	Permits int
	Epoch   uint64
	Entries []Entry
	// HeldSlots lists the slots a live holder holds, from the backend's
	// holder records, whether or not their token message was found. A held
	// slot is never proven absent.
	HeldSlots []int
	// HeldUnseen says held tokens are not among Entries (RabbitMQ cannot
	// read an unacked message): each held slot then has one more token than
	// its entries show, and every entry of it is a surplus copy.
	HeldUnseen bool
	// Problems are what the backend found wrong that no repair here can
	// fix (such as a slot held by a record that names no token in the
	// stream), each with its reason. Any makes the census unhealthy.
	Problems []string
}

// Findings classify a census.
type Findings struct {
	Valid      int             // valid token messages
	Duplicates map[int][]Entry // index -> its valid messages, where more than one
	Missing    []int           // indices with no valid message and no live holder
	Invalid    []Entry         // junk, forged, foreign or retired messages
	// Retiring are retired tokens (of slots a shrink removed) that a live
	// holder still holds. They are not removed: the holder keeps its permit
	// until it releases, and the next acquirer then removes the token, or
	// admits it again if the semaphore grew back meanwhile (removing it
	// here would lose that slot until the next reconcile). They do not make
	// a semaphore unhealthy.
	Retiring []Entry
}

// Healthy reports whether the census found exactly one valid token per slot
// and nothing else (retired tokens still held aside: see Retiring), and the
// backend reported no Problems.
func (f Findings) Healthy(c Census) bool {
	valid := f.Valid
	if c.HeldUnseen {
		valid += len(c.HeldSlots)
	}
	return valid == c.Permits && len(f.Duplicates) == 0 && len(f.Missing) == 0 && len(f.Invalid) == 0 && len(c.Problems) == 0
}

// DuplicateIndices returns the duplicated indices in order.
func (f Findings) DuplicateIndices() []int {
	out := make([]int, 0, len(f.Duplicates))
	for i := range f.Duplicates {
		out = append(out, i)
	}
	slices.Sort(out)
	return out
}

// Analyze classifies a census.
func Analyze(c Census) Findings {
	f := Findings{Duplicates: map[int][]Entry{}}
	byIndex := make(map[int][]Entry, c.Permits)
	for _, e := range c.Entries {
		if !e.Valid {
			if e.Held && e.Reason == "retired" {
				f.Retiring = append(f.Retiring, e)
			} else {
				f.Invalid = append(f.Invalid, e)
			}
			continue
		}
		f.Valid++
		byIndex[e.Token.Index] = append(byIndex[e.Token.Index], e)
	}
	held := make(map[int]bool, len(c.HeldSlots))
	for _, i := range c.HeldSlots {
		held[i] = true
	}
	for i := 0; i < c.Permits; i++ {
		es := byIndex[i]
		n := len(es)
		if c.HeldUnseen && held[i] {
			n++
		}
		switch {
		case n == 0 && !held[i]:
			f.Missing = append(f.Missing, i)
		case n > 1:
			f.Duplicates[i] = es
		}
	}
	return f
}

// Summarize fills the part of a tokensem.Status that a census decides:
// permits, epoch, tokens (messages found, plus the held ones a census
// cannot see), held slots, available permits (distinct valid tokens of
// slots nobody holds), duplicates, missing slots, invalid tokens, health,
// and the census's Problems as warnings. The backend adds its name,
// resource, lease, waiters, holders and other warnings.
func Summarize(c Census) tokensem.Status {
	f := Analyze(c)
	st := tokensem.Status{
		Permits: c.Permits, Epoch: c.Epoch, Tokens: len(c.Entries), Held: len(c.HeldSlots),
		Duplicate: f.DuplicateIndices(), Missing: append([]int{}, f.Missing...), Invalid: len(f.Invalid),
		Healthy: f.Healthy(c), Holders: []tokensem.Holder{}, Warnings: append([]string{}, c.Problems...),
	}
	if c.HeldUnseen {
		st.Tokens += len(c.HeldSlots)
	}
	held := make(map[int]bool, len(c.HeldSlots))
	for _, i := range c.HeldSlots {
		held[i] = true
	}
	seen := make(map[int]bool)
	for _, e := range c.Entries {
		if e.Valid && !held[e.Token.Index] && !seen[e.Token.Index] {
			seen[e.Token.Index] = true
			st.Available++
		}
	}
	return st
}

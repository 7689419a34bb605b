package natssem

import (
	"runtime"
	"sync"
	"weak"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokensem/tokensem/internal/cfgcache"
)

// groupShare is what the Semaphores of one group on one connection share:
// the group's generation as last read (generation.go), and the group's
// stream and bucket once an Init found them, so that the Init of each
// further key skips their two lookups.
type groupShare struct {
	gen cfgcache.Cache[genValue]

	mu     sync.Mutex
	stream jetstream.Stream // nil until found
	kv     jetstream.KeyValue
}

// found returns the group's stream and bucket, if an Init found them.
func (g *groupShare) found() (jetstream.Stream, jetstream.KeyValue) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.stream, g.kv
}

// remember keeps the group's stream and bucket an Init found.
func (g *groupShare) remember(stream jetstream.Stream, kv jetstream.KeyValue) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.stream, g.kv = stream, kv
}

// forget drops them: an Init that failed looks them up again (an operator
// may have deleted the group's stream or bucket).
func (g *groupShare) forget() { g.remember(nil, nil) }

type groupID struct {
	nc     *nats.Conn
	bucket string
}

// groupShares holds the share of each group a connection uses, for as long
// as one of its Semaphores does.
var groupShares = struct {
	sync.Mutex
	m map[groupID]weak.Pointer[groupShare]
}{m: map[groupID]weak.Pointer[groupShare]{}}

// sharedGroup returns the share of the group whose bucket is bucket on the
// connection nc.
func sharedGroup(nc *nats.Conn, bucket string) *groupShare {
	id := groupID{nc, bucket}
	groupShares.Lock()
	defer groupShares.Unlock()
	if g := groupShares.m[id].Value(); g != nil {
		return g
	}
	g := &groupShare{}
	groupShares.m[id] = weak.Make(g)
	runtime.AddCleanup(g, func(id groupID) {
		groupShares.Lock()
		defer groupShares.Unlock()
		if groupShares.m[id].Value() == nil {
			delete(groupShares.m, id)
		}
	}, id)
	return g
}

package natssem

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"sync"
	"time"
	"weak"

	"github.com/nats-io/nats.go"

	"github.com/tokensem/tokensem/internal/cfgcache"
)

// A group's generation lets the keys of a group trust their cached
// configurations without reading each one every configTTL.
//
// An acquirer admits tokens by a configuration read within configTTL, so
// that every client admits by a resized count within that long (Resize).
// A semaphore of its own pays one read every configTTL; a group of 10,000
// keys, each used now and then, would pay one read per Acquire. Instead,
// every change of a key's configuration that acquirers must see (Resize's
// count, Delete's removal, after which a key may be made again) writes the
// configuration first and then bumps the group's generation record
// (generationKey: one record for the whole group, its revision the
// generation). A client reads the generation before it reads a key's
// configuration and notes it with the configuration (config.gen). Past
// configTTL it trusts that configuration as long as the generation, read
// by the client within configTTL, is still the one noted.
//
// Why a change still reaches every client within configTTL: say a change
// wrote the configuration and then bumped the generation to G, both before
// time T. A client admitting later than configTTL after T has read the
// generation after T, so it read G or later; if that equals the generation
// noted with its configuration, the read that noted it ended after the
// bump, and the configuration read started after that read ended, so it
// read the change. Reads go to the stream's leader (readLast), which has
// applied every acknowledged write.
//
// One generation read per group, connection and configTTL replaces a read
// per key. Only keys created with configVersionGen, whose every client
// bumps, are trusted so; a change whose bump failed (its caller gets the
// error) reaches clients within configMaxAge, after which a configuration
// is read again whatever the generation says.

// generationKey is the group bucket's generation record. A name cannot
// start with '_', so no key's records (layout.key) can be this one.
const generationKey = "_generation"

// configMaxAge bounds how long a key's configuration is trusted on the
// generation alone.
const configMaxAge = time.Minute

// generation is a group's generation as a connection last read it, shared
// by the connection's Semaphores of that group (sharedGeneration).
type generation struct {
	cache cfgcache.Cache[uint64]
}

type generationID struct {
	nc     *nats.Conn
	bucket string
}

// generations holds the generation of each group a connection uses, for
// as long as one of its Semaphores does.
var generations = struct {
	sync.Mutex
	m map[generationID]weak.Pointer[generation]
}{m: map[generationID]weak.Pointer[generation]{}}

// sharedGeneration returns the generation of the group whose bucket is
// bucket, as the connection nc knows it.
func sharedGeneration(nc *nats.Conn, bucket string) *generation {
	id := generationID{nc, bucket}
	generations.Lock()
	defer generations.Unlock()
	if g := generations.m[id].Value(); g != nil {
		return g
	}
	g := &generation{}
	generations.m[id] = weak.Make(g)
	runtime.AddCleanup(g, func(id generationID) {
		generations.Lock()
		defer generations.Unlock()
		if generations.m[id].Value() == nil {
			delete(generations.m, id)
		}
	}, id)
	return g
}

// readGeneration reads the group's generation: the revision of its
// generation record, 0 if it was never written.
func (s *Semaphore) readGeneration(ctx context.Context) (uint64, error) {
	_, seq, err := s.readLast(ctx, generationKey)
	if err != nil && !errors.Is(err, errNoRecord) {
		return 0, wrapBrokerErr(err)
	}
	return seq, nil
}

// bumpGeneration moves the group's generation on, after a change of the
// key's configuration. A semaphore of its own has none.
func (s *Semaphore) bumpGeneration(ctx context.Context) error {
	if s.gen == nil {
		return nil
	}
	return s.retry(ctx, "generation", func() error {
		rctx, cancel := s.rtt(ctx)
		defer cancel()
		_, err := s.kv.Put(rctx, generationKey, []byte(strconv.FormatInt(time.Now().UnixMilli(), 10)))
		return wrapBrokerErr(err)
	})
}

// byGeneration returns the cached configuration if the group's generation
// vouches for it (see the top of this file).
func (s *Semaphore) byGeneration(ctx context.Context) (config, bool) {
	if s.gen == nil {
		return config{}, false
	}
	cfg, at := s.cfg.GetAt()
	if !cfg.genKnown || time.Since(at) >= configMaxAge {
		return config{}, false
	}
	g, err := s.gen.cache.Fresh(ctx, configTTL, s.readGeneration)
	return cfg, err == nil && g == cfg.gen
}

// readCurrentConfig reads the configuration; of a key whose changes bump
// its group's generation, it notes the generation read before it.
func (s *Semaphore) readCurrentConfig(ctx context.Context) (config, error) {
	var (
		g      uint64
		genErr error = errNoRecord
	)
	if s.gen != nil {
		g, genErr = s.gen.cache.Fresh(ctx, configTTL, s.readGeneration)
	}
	cfg, _, err := s.readConfig(ctx)
	if err == nil && genErr == nil && cfg.Version >= configVersionGen {
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
// will need: the group's generation when it may vouch for the cached
// configuration, else the configuration. Call stop before returning.
func (s *Semaphore) prefetchConfig(ctx context.Context) (stop func()) {
	if s.gen != nil {
		if cfg, at := s.cfg.GetAt(); cfg.genKnown && time.Since(at) < configMaxAge {
			return s.gen.cache.Prefetch(ctx, configTTL, s.readGeneration)
		}
	}
	return s.cfg.Prefetch(ctx, configTTL, s.readCurrentConfig)
}

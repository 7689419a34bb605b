package natssem

import (
	"context"
	"errors"
	"time"

	"github.com/tokensem/tokensem/internal/ids"
)

// A group's generation lets the keys of a group trust their cached
// configurations without reading each one every configTTL.
//
// An acquirer admits tokens by a configuration read within configTTL, so
// that every client admits by a resized count within that long (Resize).
// A semaphore of its own pays one read every configTTL; a group of 10,000
// keys, each used now and then, would pay one read per Acquire. Instead,
// every change of a key's configuration that acquirers must see is
// followed by a bump of the group's generation record (generationKey: one
// record for the whole group; its revision, with the random id the bump
// wrote, is the generation):
//   - Resize writes the count, then bumps (announceConfig, which skips the
//     bump when the record was written after the count already);
//   - Delete marks the key deleting, then bumps before it removes
//     anything (a deleted key may be made again with another count and
//     lease; see config.vouchable).
//
// A client reads the generation before it reads a key's configuration and
// notes it with the configuration (config.gen). Past configTTL it trusts
// that configuration as long as the generation, read by the client within
// configTTL, is still the one noted, and the configuration said ready.
//
// Why a change still reaches every client within configTTL: say a change
// wrote the configuration and then bumped the generation to G, both done
// by time T. A client admitting later than configTTL after T trusts a
// generation whose read began after T (cfgcache stamps a value with the
// start of its read), so it read G or later; if that equals the generation
// noted with its configuration, the read that noted it was answered after
// the bump, and the configuration read began after that read ended, so it
// read the change. Reads go to the stream's leader (readLast), which has
// applied every acknowledged write.
//
// A generation no bump wrote (a bucket made by hand, or whose creator died
// before its first bump: bumped) vouches for nothing, so that two buckets
// of one group name, made one after the other, never share a generation.
// The epoch that tokens and records carry keeps lives apart in any case
// (see docs/protocol-nats.md); the generation only carries resizes.
//
// One generation read per group, connection and configTTL replaces a read
// per key. Only keys created with configVersionGen, whose every client
// bumps, are trusted so. A Resize whose bump failed returns the error (run
// again, it bumps); until then, and for whatever else fails to bump, a
// configuration is trusted on the generation for at most configMaxAge.
// A Delete whose bump fails removes nothing.

// generationKey is the group bucket's generation record. Every record of
// a key (layout.key) has a '.' after the key's name; this one has none.
const generationKey = "_generation"

// configMaxAge bounds how long a key's configuration is trusted on the
// generation alone.
const configMaxAge = time.Minute

// genValue is a generation: the revision of the generation record and the
// random id its bump wrote. The id tells apart a bucket made again, whose
// revisions start over.
type genValue struct {
	seq uint64
	id  string
}

// bumped reports whether the generation was written by a bump. Without one
// (a group bucket made by hand, or whose creator died before its first
// bump) there is nothing to tell two buckets apart by: it vouches for
// nothing, and keys read their configuration every configTTL.
func (g genValue) bumped() bool { return g.id != "" }

// readGeneration reads the group's generation (the zero genValue if it
// was never bumped).
func (s *Semaphore) readGeneration(ctx context.Context) (genValue, error) {
	data, seq, err := s.readLast(ctx, generationKey)
	switch {
	case errors.Is(err, errNoRecord):
		return genValue{seq: seq}, nil
	case err != nil:
		return genValue{}, wrapBrokerErr(err)
	case !ids.Valid(string(data)):
		// Not an id a bump writes (bumpGeneration): it vouches for
		// nothing, and is not kept.
		return genValue{seq: seq}, nil
	}
	return genValue{seq: seq, id: string(data)}, nil
}

// bumpGeneration moves the group's generation on, after a change of the
// key's configuration. A semaphore of its own has none. The change is
// made already, so the bump is not cut short with ctx: it gets request
// timeouts of its own, for up to bumpTimeout.
func (s *Semaphore) bumpGeneration(ctx context.Context) error {
	if s.group == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), bumpTimeout)
	defer cancel()
	return s.retry(ctx, "generation", func() error {
		rctx, cancel := s.rtt(ctx)
		defer cancel()
		_, err := s.kv.Put(rctx, generationKey, []byte(ids.New()))
		return wrapBrokerErr(err)
	})
}

// bumpTimeout bounds the retries of a bump.
const bumpTimeout = 10 * time.Second

// announceConfig makes sure the last write of the key's configuration is
// covered by a bump: it bumps unless the generation record was written
// after the configuration (both are messages of the bucket's stream, so
// their revisions compare). Resize calls it last, so that a Resize run
// again after a bump that failed, or to a count the key already has,
// bumps only when needed.
func (s *Semaphore) announceConfig(ctx context.Context) error {
	if s.group == nil {
		return nil
	}
	_, rev, err := s.readConfig(ctx)
	if err != nil {
		return err
	}
	if g, err := s.readGeneration(ctx); err == nil && g.seq > rev {
		return nil
	}
	return s.bumpGeneration(ctx)
}

// byGeneration returns the cached configuration while it is younger than
// configTTL, or while the group's generation vouches for it (see the top
// of this file).
func (s *Semaphore) byGeneration(ctx context.Context) (config, bool) {
	if s.group == nil {
		return config{}, false
	}
	cfg, age, byGen := s.cachedConfig()
	switch {
	case age < configTTL:
		return cfg, true
	case !byGen:
		return config{}, false
	}
	g, err := s.group.gen.Fresh(ctx, configTTL, s.readGeneration)
	return cfg, err == nil && g.bumped() && g == cfg.gen
}

// vouchable reports whether the generation may vouch for c: it was read
// after a generation, and the key was ready then. A key being deleted
// may be made again; its Delete bumps the generation after marking it
// (deleteLocked), not after removing it, so a client that read the mark
// reads the configuration again until it finds the next life's.
func (c config) vouchable() bool { return c.genKnown && c.State == stateReady }

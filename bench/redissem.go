package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisSem is the classic Redis sorted-set semaphore the seed documents
// describe (Redis in Action's "basic" semaphore, made atomic with Lua): the
// holders are members of a sorted set scored by the time they acquired.
// Acquire runs one script that drops the members older than the lease
// (ZREMRANGEBYSCORE), adds the caller with the current time (ZADD) and
// admits it if its rank is below N (ZRANK); otherwise it removes the caller
// again (ZREM) and the caller sleeps a random jitter and retries. Release
// is ZREM. Time comes from the server (TIME inside the script), in
// microseconds, so client clock skew cannot reorder holders; the design
// still relies on that clock never going backwards.
//
// It is a baseline to compare against, not a library: no lease renewal
// (holds here are far shorter than the lease), no FIFO, no fencing.
type RedisSem struct {
	c        *redis.Client
	key      string
	n        int
	lease    time.Duration
	jmin     time.Duration
	jmax     time.Duration
	waiting  *atomic.Int64 // callers that failed once and are retrying
	attempts *atomic.Int64 // scripts run, for the record
}

// acquireScript: KEYS[1] the set; ARGV[1] N, ARGV[2] member, ARGV[3] lease
// in µs. Returns 1 when admitted, 0 otherwise.
var acquireScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[3]))
redis.call('ZADD', KEYS[1], now, ARGV[2])
if redis.call('ZRANK', KEYS[1], ARGV[2]) < tonumber(ARGV[1]) then
  return 1
end
redis.call('ZREM', KEYS[1], ARGV[2])
return 0
`)

// countScript drops expired holders and counts the rest.
var countScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[1]))
return redis.call('ZCARD', KEYS[1])
`)

// DefaultRedisLease is how long a Redis holder keeps its place without
// renewal: much longer than any hold in the benchmarks.
const DefaultRedisLease = 30 * time.Second

func redisKey(name string) string  { return "sem:" + name }
func redisNKey(name string) string { return "sem:" + name + ":n" }

// InitRedisSem records that name has n permits (the set itself starts
// empty: Redis stores holders, not tokens).
func InitRedisSem(ctx context.Context, c *redis.Client, name string, n int) error {
	return c.Set(ctx, redisNKey(name), n, 0).Err()
}

// OpenRedisSem reads name's permit count.
func OpenRedisSem(ctx context.Context, c *redis.Client, name string, jmin, jmax time.Duration, waiting *atomic.Int64) (*RedisSem, error) {
	n, err := c.Get(ctx, redisNKey(name)).Int()
	if errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("redis semaphore %s: not initialized", name)
	}
	if err != nil {
		return nil, err
	}
	if waiting == nil {
		waiting = new(atomic.Int64)
	}
	return &RedisSem{c: c, key: redisKey(name), n: n, lease: DefaultRedisLease, jmin: jmin, jmax: jmax,
		waiting: waiting, attempts: new(atomic.Int64)}, nil
}

type redisHeld struct {
	s  *RedisSem
	id string
}

// Release removes the caller from the set.
func (h redisHeld) Release(ctx context.Context) error {
	return h.s.c.ZRem(ctx, h.s.key, h.id).Err()
}

// TryAcquire runs the acquire script once.
func (s *RedisSem) TryAcquire(ctx context.Context, id string) (bool, error) {
	s.attempts.Add(1)
	ok, err := acquireScript.Run(ctx, s.c, []string{s.key}, s.n, id, s.lease.Microseconds()).Int()
	return ok == 1, err
}

// Acquire retries until admitted or ctx ends, sleeping a random jitter in
// [jmin, jmax] after every refusal.
func (s *RedisSem) Acquire(ctx context.Context) (Held, error) {
	id := newID()
	waiting := false
	defer func() {
		if waiting {
			s.waiting.Add(-1)
		}
	}()
	for {
		ok, err := s.TryAcquire(ctx, id)
		if err != nil {
			return nil, err
		}
		if ok {
			return redisHeld{s: s, id: id}, nil
		}
		if !waiting {
			waiting = true
			s.waiting.Add(1)
		}
		d := s.jmin
		if s.jmax > s.jmin {
			d += mrand.N(s.jmax - s.jmin + 1)
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

// Status counts the live holders.
func (s *RedisSem) Status(ctx context.Context) (Census, error) {
	held, err := countScript.Run(ctx, s.c, []string{s.key}, s.lease.Microseconds()).Int()
	if err != nil {
		return Census{}, err
	}
	return Census{Permits: s.n, Held: held, Available: max(s.n-held, 0), Tokens: s.n, Healthy: held <= s.n,
		Waiting: int(s.waiting.Load())}, nil
}

// Close does nothing: the client belongs to the caller.
func (s *RedisSem) Close() error { return nil }

func newID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// jitterLabel names a jitter range, e.g. "50–200 ms".
func jitterLabel(jmin, jmax time.Duration) string {
	return strconv.FormatInt(jmin.Milliseconds(), 10) + "–" + strconv.FormatInt(jmax.Milliseconds(), 10) + " ms"
}

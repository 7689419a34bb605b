package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrNoRedis says redis-server is not installed, and how to install it.
var ErrNoRedis = errors.New("redis-server not found on PATH: install it with `apt-get install -y redis-server` " +
	"(Debian/Ubuntu; `brew install redis` on macOS) or name the binary with -redis-server")

// RedisServer is a redis-server the harness started on a random loopback
// port, with no persistence, in a temporary directory.
type RedisServer struct {
	Addr    string
	Version string
	cmd     *exec.Cmd
	dir     string
	exited  chan struct{}
	stderr  bytes.Buffer
}

// StartRedis starts bin (empty: redis-server from PATH).
func StartRedis(ctx context.Context, bin string) (*RedisServer, error) {
	if bin == "" {
		bin = "redis-server"
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, ErrNoRedis
	}
	var last error
	for range 5 { // a free port may be taken between probing and binding
		r, err := startRedisOnce(ctx, path)
		if err == nil {
			return r, nil
		}
		last = err
	}
	return nil, last
}

func startRedisOnce(ctx context.Context, path string) (*RedisServer, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "bench-redis-*")
	if err != nil {
		return nil, err
	}
	r := &RedisServer{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: dir, exited: make(chan struct{})}
	r.cmd = exec.Command(path,
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--protected-mode", "yes",
		"--save", "", "--appendonly", "no", "--dir", dir, "--daemonize", "no",
		"--logfile", "", "--loglevel", "warning")
	r.cmd.Stderr = &r.stderr
	r.cmd.Stdout = &r.stderr
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // dies with the harness
	if err := r.cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("start redis-server: %w", err)
	}
	go func() { _ = r.cmd.Wait(); close(r.exited) }()
	c := redis.NewClient(&redis.Options{Addr: r.Addr, DisableIdentity: true, MaxRetries: -1})
	defer c.Close()
	for deadline := time.Now().Add(10 * time.Second); ; {
		select {
		case <-r.exited:
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("redis-server exited at start: %s", strings.TrimSpace(r.stderr.String()))
		default:
		}
		if err := c.Ping(ctx).Err(); err == nil {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			r.Stop()
			return nil, fmt.Errorf("redis-server on %s did not answer PING", r.Addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	info, err := c.Info(ctx, "server").Result()
	if err == nil {
		for line := range strings.SplitSeq(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
				r.Version = v
			}
		}
	}
	return r, nil
}

// Stop terminates the server and removes its directory.
func (r *RedisServer) Stop() {
	if r.cmd.Process != nil {
		_ = r.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-r.exited:
		case <-time.After(3 * time.Second):
			_ = r.cmd.Process.Kill()
			<-r.exited
		}
	}
	_ = os.RemoveAll(r.dir)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// redisSystem is the sorted-set semaphore with one retry jitter range.
type redisSystem struct {
	srv        *RedisServer
	key        string
	jmin, jmax time.Duration
	probe      *redis.Client

	mu      sync.Mutex
	waiting map[string]*atomic.Int64
}

func newRedisSystem(srv *RedisServer, key string, jmin, jmax time.Duration) *redisSystem {
	return &redisSystem{srv: srv, key: key, jmin: jmin, jmax: jmax, waiting: map[string]*atomic.Int64{},
		probe: newRedisClient(srv.Addr, 4)}
}

func newRedisClient(addr string, pool int) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true, PoolSize: pool,
		ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second})
}

func (r *redisSystem) Key() string   { return r.key }
func (r *redisSystem) Label() string { return "redis zset, retry " + jitterLabel(r.jmin, r.jmax) }

func (r *redisSystem) counter(name string) *atomic.Int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.waiting[name]
	if c == nil {
		c = new(atomic.Int64)
		r.waiting[name] = c
	}
	return c
}

// Connect returns a client with a pool of its own: one connection for one
// worker, more for a client shared by thousands of waiters.
func (r *redisSystem) Connect(ctx context.Context) (Client, error) {
	return &redisClient{r: r, c: newRedisClient(r.srv.Addr, 64)}, nil
}

func (r *redisSystem) Waiting(ctx context.Context, name string) (int, error) {
	return int(r.counter(name).Load()), nil
}

func (r *redisSystem) WaitersPerClient() int { return 0 }

func (r *redisSystem) Cleanup(ctx context.Context, name string) {
	_ = r.probe.Del(ctx, redisKey(name), redisNKey(name)).Err()
}

func (r *redisSystem) Close() { _ = r.probe.Close() }

type redisClient struct {
	r *redisSystem
	c *redis.Client
}

func (c *redisClient) Init(ctx context.Context, name string, n, _ int) (Sem, error) {
	if err := InitRedisSem(ctx, c.c, name, n); err != nil {
		return nil, err
	}
	return c.Open(ctx, name)
}

func (c *redisClient) Open(ctx context.Context, name string) (Sem, error) {
	return OpenRedisSem(ctx, c.c, name, c.r.jmin, c.r.jmax, c.r.counter(name))
}

func (c *redisClient) Close() error { return c.c.Close() }

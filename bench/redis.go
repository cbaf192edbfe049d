package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// The classic design: one token bucket per identity in Redis, read, refilled
// and charged atomically by a Lua script, with Redis's own clock so that the
// gateway nodes' clocks do not matter. Each gateway node has its own client
// (connection pool) to the one server. Numbers are stored with
// string.format: Lua's tostring keeps 14 significant digits, which would
// round a microsecond timestamp to 100 µs and mint tokens on every call.
const tokenBucketLua = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local s = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(s[1])
local ts = tonumber(s[2])
if tokens == nil then
  tokens = burst
  ts = now
end
if now > ts then
  tokens = math.min(burst, tokens + (now - ts) * rate / 1000000)
  ts = now
end
local allowed = 0
if tokens >= cost then
  tokens = tokens - cost
  allowed = 1
end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.6f', tokens), 'ts', string.format('%.0f', ts))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst * 1000 / rate) + 1000)
return allowed
`

// errNoRedis is returned when redis-server is not installed and cannot be.
var errNoRedis = errors.New("redis-server is not installed (scripts/install-redis.sh installs it, as root)")

// redisServer is a redis-server child process on a free loopback port,
// with no persistence.
type redisServer struct {
	cmd  *exec.Cmd
	addr string
}

// ensureRedis finds redis-server, installing Debian's package with apt-get
// when it is missing and root is true (the process runs as root).
func ensureRedis(logf func(string, ...any), root bool) (string, error) {
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p, nil
	}
	if !root {
		return "", errNoRedis
	}
	logf("redis-server missing: installing Debian's package with apt-get")
	for _, args := range [][]string{{"update", "-qq"}, {"install", "-y", "-qq", "--no-install-recommends", "redis-server"}} {
		cmd := exec.Command("apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("apt-get %v: %w: %s", args, err, out)
		}
	}
	return exec.LookPath("redis-server")
}

// freePort returns a loopback port that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// startRedis starts redis-server on 127.0.0.1 with no persistence and waits
// until it answers PING.
func startRedis(bin string, timeout time.Duration) (*redisServer, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin,
		"--bind", "127.0.0.1", "--port", strconv.Itoa(port),
		"--save", "", "--appendonly", "no", "--protected-mode", "yes",
		"--daemonize", "no", "--loglevel", "warning", "--dir", os.TempDir(),
	)
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &redisServer{cmd: cmd, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
	c := redis.NewClient(&redis.Options{Addr: s.addr})
	defer c.Close()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return s, nil
		}
		if time.Now().After(deadline) {
			s.Stop()
			return nil, fmt.Errorf("redis-server on %s: %w", s.addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// CPU is the CPU time (user and system) the server has used so far; 0 when
// the system does not say.
func (s *redisServer) CPU() time.Duration {
	if s == nil || s.cmd.Process == nil {
		return 0
	}
	return childCPU(s.cmd.Process.Pid)
}

// Stop ends the server this process started.
func (s *redisServer) Stop() {
	if s == nil || s.cmd.Process == nil {
		return
	}
	s.cmd.Process.Kill()
	s.cmd.Wait()
}

// redisSystem runs the token-bucket script, one client per gateway node,
// for a bucket of limit tokens per second and a burst of burst.
type redisSystem struct {
	clients      []*redis.Client
	script       *redis.Script
	limit, burst int
}

// newRedisSystem connects one client per node to addr, each with a pool of
// poolPerNode connections (0: go-redis's default, 10 per GOMAXPROCS), for
// the distributed section's rule (ruleLimit per second, burst ruleBurst).
func newRedisSystem(addr string, poolPerNode int) (*redisSystem, error) {
	return newRedisBucket(addr, poolPerNode, ruleLimit, ruleBurst)
}

// newRedisBucket is newRedisSystem for a bucket of limit per second and a
// burst of burst.
func newRedisBucket(addr string, poolPerNode, limit, burst int) (*redisSystem, error) {
	r := &redisSystem{script: redis.NewScript(tokenBucketLua), limit: limit, burst: burst}
	for range nodes {
		r.clients = append(r.clients, redis.NewClient(&redis.Options{Addr: addr, PoolSize: poolPerNode}))
	}
	if err := r.script.Load(context.Background(), r.clients[0]).Err(); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// Allow implements system: EVALSHA of the script on the node's client.
func (r *redisSystem) Allow(ctx context.Context, node int, key string) (bool, error) {
	v, err := r.script.Run(ctx, r.clients[node], []string{key}, r.limit, r.burst, 1).Int()
	return v == 1, err
}

// Close closes the clients.
func (r *redisSystem) Close() {
	for _, c := range r.clients {
		c.Close()
	}
}

package envoyoracle

import (
	"context"
	"fmt"
	"math/rand"
	"net"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	gostats "github.com/lyft/gostats"
	logger "github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/envoyproxy/ratelimit/src/config"
	"github.com/envoyproxy/ratelimit/src/redis"
	"github.com/envoyproxy/ratelimit/src/server"
	ratelimit "github.com/envoyproxy/ratelimit/src/service"
	"github.com/envoyproxy/ratelimit/src/settings"
	"github.com/envoyproxy/ratelimit/src/stats"
	"github.com/envoyproxy/ratelimit/src/utils"
)

// pinnedSettings are envoyproxy/ratelimit's settings for every run, as the
// environment variables it reads (settings.NewSettings reads them again on
// every config load, so they are process-wide). The values are its defaults
// except where a comment says why.
var pinnedSettings = map[string]string{
	"BACKEND_TYPE":                            "redis",
	"REDIS_SOCKET_TYPE":                       "tcp", // default unix: the test's server is on loopback TCP
	"REDIS_TYPE":                              "SINGLE",
	"REDIS_POOL_SIZE":                         "10",
	"REDIS_PIPELINE_WINDOW":                   "0", // no implicit pipelining: each request is its own round trip
	"REDIS_PIPELINE_LIMIT":                    "0",
	"REDIS_PERSECOND":                         "false",
	"LOCAL_CACHE_SIZE_IN_BYTES":               "0", // no local over-limit cache: Redis decides every request
	"NEAR_LIMIT_RATIO":                        "0.8",
	"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "false",
	"EXPIRATION_JITTER_MAX_SECONDS":           "300",
	"CACHE_KEY_PREFIX":                        "",
	"SHADOW_MODE":                             "false",
	"QUOTA_MODE":                              "false",
	"MERGE_DOMAIN_CONFIG":                     "false",
	"RESPONSE_DYNAMIC_METADATA":               "false",
	"LIMIT_RESPONSE_HEADERS_ENABLED":          "false", // a run sets it to true to compare the headers
	"LIMIT_LIMIT_HEADER":                      "RateLimit-Limit",
	"LIMIT_REMAINING_HEADER":                  "RateLimit-Remaining",
	"LIMIT_RESET_HEADER":                      "RateLimit-Reset",
	"CONFIG_TYPE":                             "FILE",
	"RUNTIME_SUBDIRECTORY":                    "ratelimit",
	"RUNTIME_APPDIRECTORY":                    "config",
	"RUNTIME_WATCH_ROOT":                      "true",
	"RUNTIME_IGNOREDOTFILES":                  "false",
	"FORCE_START_WITHOUT_INITIAL_CONFIG":      "false",
	"LOG_LEVEL":                               "ERROR",
	"USE_STATSD":                              "false", // stats go to a null sink: nothing leaves the process
	"DISABLE_STATS":                           "true",
	"TRACING_ENABLED":                         "false",
}

var envOnce sync.Once

// pinEnvironment sets pinnedSettings in the process environment once.
func pinEnvironment() {
	envOnce.Do(func() {
		for k, v := range pinnedSettings {
			os.Setenv(k, v)
		}
		logger.SetLevel(logger.ErrorLevel)
	})
}

// envoyMu serializes envoy services: their settings are process-wide.
var envoyMu sync.Mutex

// fakeClock is envoyproxy/ratelimit's TimeSource (unix seconds), set by the
// test before each request.
type fakeClock struct{ now atomic.Int64 }

func (c *fakeClock) UnixNow() int64 { return c.now.Load() }

// envoyService is envoyproxy/ratelimit's service in this process: the parts
// its runner.Run wires (server, file provider, Redis cache, service), wired
// the same way, except that the time source is the test's and the gRPC
// server listens on an ephemeral loopback port instead of settings' fixed
// ones (runner.Run hard-wires the system clock and fixed ports).
type envoyService struct {
	clock  *fakeClock
	addr   string
	client pb.RateLimitServiceClient
}

// startEnvoy runs envoyproxy/ratelimit's service over the descriptor files,
// copied into a runtime directory laid out as its integration test's
// (RUNTIME_ROOT/ratelimit/config/*.yaml), against Redis at redisAddr.
func startEnvoy(t *testing.T, redisAddr string, files []string, headers bool) *envoyService {
	t.Helper()
	pinEnvironment()
	envoyMu.Lock()
	t.Cleanup(envoyMu.Unlock)
	root := t.TempDir()
	dir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	os.Setenv("RUNTIME_ROOT", root)
	os.Setenv("REDIS_URL", redisAddr)
	os.Setenv("LIMIT_RESPONSE_HEADERS_ENABLED", fmt.Sprint(headers))
	s := settings.NewSettings()

	clock := &fakeClock{}
	clock.now.Store(time.Now().Unix())
	store := gostats.NewStore(gostats.NewNullSink(), false)
	sm := stats.NewStatManager(store, s)
	pass := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		return h(ctx, req)
	}
	srv := server.NewServer(s, "ratelimit", sm, nil, settings.GrpcUnaryInterceptor(pass))
	cache, closer := redis.NewRateLimiterCacheImplFromSettings(s, nil, srv, clock,
		rand.New(utils.NewLockedSource(1)), s.ExpirationJitterMaxSeconds, sm)
	svc := ratelimit.NewService(cache, srv.Provider(), sm, srv.HealthChecker(), clock,
		s.GlobalShadowMode, s.ForceStartWithoutInitialConfig, s.HealthyWithAtLeastOneConfigLoaded)
	if cfg, _, _ := svc.GetCurrentConfig(); cfg == nil {
		t.Fatalf("envoyproxy/ratelimit loaded no config from %v", files)
	}
	pb.RegisterRateLimitServiceServer(srv.GrpcServer(), svc)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.GrpcServer().Serve(ln)
	t.Cleanup(func() {
		srv.Stop()
		_ = closer.Close()
	})
	e := &envoyService{clock: clock, addr: ln.Addr().String()}
	e.client = dial(t, e.addr)
	return e
}

// dial opens a gRPC client to addr, closed when the test ends.
func dial(t *testing.T, addr string) pb.RateLimitServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pb.NewRateLimitServiceClient(conn)
}

// envoyLoads loads descriptor files with envoyproxy/ratelimit's own config
// loader (the one its file provider calls), with MERGE_DOMAIN_CONFIG as
// given; it returns nil when they load and the config error otherwise.
func envoyLoads(files []string, merge bool) (err error) {
	pinEnvironment()
	var toLoad []config.RateLimitConfigToLoad
	sorted := append([]string(nil), files...)
	sort.Strings(sorted)
	defer func() {
		if e := recover(); e != nil {
			err = fmt.Errorf("%v", e)
		}
	}()
	for _, f := range sorted {
		b, rerr := os.ReadFile(f)
		if rerr != nil {
			return rerr
		}
		name := "config." + filepath.Base(f)
		toLoad = append(toLoad, config.RateLimitConfigToLoad{Name: name, ConfigYaml: config.ConfigFileContentToYaml(name, string(b))})
	}
	store := gostats.NewStore(gostats.NewNullSink(), false)
	sm := stats.NewStatManager(store, settings.NewSettings())
	config.NewRateLimitConfigLoaderImpl().Load(toLoad, sm, merge)
	return nil
}

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gubernator-io/gubernator/v2"
	"github.com/sirupsen/logrus"
	"golang.org/x/time/rate"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/ops"
	"github.com/weir-dev/weir/quota"
)

// ---- weir: three nodes on loopback, one rule per mode

const clusterRules = `
rules:
  - id: shared
    key: [ip]
    limit: 1000
    window: 1s
    burst: 100
    mode: shared
  - id: exact
    key: [ip]
    limit: 1000
    window: 1s
    burst: 100
    mode: exact
  - id: sketched
    key: [ip]
    limit: 1000
    window: 1s
    burst: 100
    mode: shared
    sketch: {threshold: 8, width: 1048576, depth: 2}
`

// weirCluster is three weir nodes of one region, joined by memberlist and
// peer gRPC on 127.0.0.1 ephemeral ports.
type weirCluster struct {
	nodes []*weir.Node
}

// startWeirCluster starts the nodes with the distributed section's rules
// and waits until each sees all three.
func startWeirCluster(timeout time.Duration) (*weirCluster, error) {
	return startCluster(clusterRules, func(i int) *weir.ClusterConfig {
		// LAN memberlist timings (the production profile): the local
		// profile's fast failure detection declares live nodes dead on a
		// machine saturated by the benchmark itself.
		return &weir.ClusterConfig{
			Name: fmt.Sprintf("bench-%d", i), Region: "bench", Label: "weir-bench",
			GossipAddr: "127.0.0.1:0", RPCAddr: "127.0.0.1:0",
			DecideTimeout: time.Second, CallTimeout: 2 * time.Second,
		}
	}, timeout)
}

// startCluster starts three nodes of one region with the rules of the YAML
// document rulesYAML, node i with the cluster configuration cc(i) (Join is
// set here: every node joins the first), and waits until each sees all
// three.
func startCluster(rulesYAML string, cc func(i int) *weir.ClusterConfig, timeout time.Duration) (*weirCluster, error) {
	rules, err := quota.Parse("bench.yaml", []byte(rulesYAML))
	if err != nil {
		return nil, err
	}
	c := &weirCluster{}
	for i := range nodes {
		cfg := cc(i)
		if i > 0 {
			cfg.Join = []string{ops.GossipAddr(c.nodes[0])}
		}
		n, err := weir.New(weir.Config{Rules: rules, Cluster: cfg})
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("weir node %d: %w", i, err)
		}
		c.nodes = append(c.nodes, n)
	}
	deadline := time.Now().Add(timeout)
	for {
		all := true
		for _, n := range c.nodes {
			if len(ops.Members(n)) != nodes {
				all = false
			}
		}
		if all {
			return c, nil
		}
		if time.Now().After(deadline) {
			c.Close()
			return nil, errors.New("weir cluster: members did not converge")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Close stops every node.
func (c *weirCluster) Close() {
	for _, n := range c.nodes {
		n.Close()
	}
}

// degraded sums the fail-open decisions of every node and rule.
func (c *weirCluster) degraded() uint64 {
	var s uint64
	for _, n := range c.nodes {
		for _, rc := range ops.Counts(n) {
			s += rc.FailOpen
		}
	}
	return s
}

// weirRuleSystem decides through one rule of the cluster with Node.Check.
type weirRuleSystem struct {
	c    *weirCluster
	rule string
}

// Allow implements system.
func (w weirRuleSystem) Allow(ctx context.Context, node int, key string) (bool, error) {
	r, err := w.c.nodes[node].Check(ctx, key, w.rule, 1)
	return r.Allowed, err
}

// sharedSlack is S for the shared rule: the two non-owner nodes' slack,
// sᵢ = ⌊a·L ÷ N⌋ with the default accuracy a = 5 % (docs/overshoot.md).
func sharedSlack() float64 {
	a := 0.05
	return float64(nodes-1) * math.Floor(a*ruleLimit/nodes)
}

// sketchThreshold is the sketched rule's θ (sketch: {threshold: 8}, at most
// the node's slack ⌊0.05·1000 ÷ 3⌋ = 16). The sketch is sized as
// docs/rules.md says, to the stream: a node sees about a million one-token
// identities per period (the rule's window, 1 s) at saturation, so width
// 2²⁰; the default 65 536 would track a large share of them by mistake
// (each a bucket and a sync), and two rows suffice at that width (each row
// is a cache miss per decision).
const sketchThreshold = 8

// sketchedSlack is what the sketched rule may admit beyond B + r·Δ over one
// hot-identity run of at most two sketch periods (the rule's window, 1 s):
// the slack S plus docs/overshoot.md's sketch term N·θ·(⌈Δ/P⌉ + 1).
func sketchedSlack() float64 {
	return sharedSlack() + float64(nodes*sketchThreshold*2)
}

// ---- gubernator: three daemons in process, static peers on loopback

// gubernatorCluster is three gubernator daemons with static peers (no
// discovery), their gRPC and HTTP listeners on 127.0.0.1 ephemeral ports.
type gubernatorCluster struct {
	daemons []*gubernator.Daemon
}

// startGubernator spawns the daemons and gives each the peer list; each
// daemon's cache holds cacheSize limits.
func startGubernator(ctx context.Context, cacheSize int) (*gubernatorCluster, error) {
	lg := logrus.New()
	lg.SetOutput(io.Discard)
	lg.SetLevel(logrus.PanicLevel)
	c := &gubernatorCluster{}
	var peers []gubernator.PeerInfo
	for i := range nodes {
		d, err := gubernator.SpawnDaemon(ctx, gubernator.DaemonConfig{
			InstanceID:        fmt.Sprintf("gub-%d", i),
			GRPCListenAddress: "127.0.0.1:0",
			HTTPListenAddress: "127.0.0.1:0",
			PeerDiscoveryType: "none",
			CacheSize:         cacheSize,
			Logger:            logrus.NewEntry(lg),
		})
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("gubernator daemon %d: %w", i, err)
		}
		c.daemons = append(c.daemons, d)
		peers = append(peers, gubernator.PeerInfo{
			GRPCAddress: d.GRPCListeners[0].Addr().String(),
			HTTPAddress: d.HTTPListener.Addr().String(),
		})
	}
	// Each daemon learns the three addresses and which one is itself (the
	// daemons listen on ephemeral ports, so their advertised address in the
	// config cannot name it).
	for i, d := range c.daemons {
		own := make([]gubernator.PeerInfo, len(peers))
		copy(own, peers)
		own[i].IsOwner = true
		d.PeerInfo = peers[i]
		d.V1Server.SetPeers(own)
	}
	return c, nil
}

// closeWait bounds how long Close waits for the daemons.
const closeWait = 5 * time.Second

// Close stops every daemon, waiting at most closeWait: gubernator v2.13.0's
// Daemon.Close can hang for good after GLOBAL traffic (its broadcast loop's
// Interval.Stop waits on a goroutine that never ends). A daemon that has
// not closed by then is left behind, counted in abandoned, and its
// goroutines end with the process.
func (c *gubernatorCluster) Close() {
	done := make(chan struct{})
	go func() {
		var wg sync.WaitGroup
		for _, d := range c.daemons {
			wg.Go(d.Close)
		}
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(closeWait):
		gubernatorAbandoned.Add(1)
	}
}

// gubernatorAbandoned counts clusters whose Close did not return in time.
var gubernatorAbandoned atomic.Int64

// gubernatorSystem asks one behaviour of the cluster. The gateway embeds
// gubernator the way it embeds weir: Allow calls the node's V1Instance in
// process (no client hop); the node forwards to the key's owner over gRPC
// as gubernator does.
type gubernatorSystem struct {
	c        *gubernatorCluster
	behavior gubernator.Behavior
	// limit per second and burst of the LEAKY_BUCKET limit.
	limit, burst int64
}

// Allow implements system: one hit on a LEAKY_BUCKET limit of g.limit per
// second with a burst of g.burst.
func (g gubernatorSystem) Allow(ctx context.Context, node int, key string) (bool, error) {
	resp, err := g.c.daemons[node].V1Server.GetRateLimits(ctx, &gubernator.GetRateLimitsReq{
		Requests: []*gubernator.RateLimitReq{{
			Name:      "bench",
			UniqueKey: key,
			Hits:      1,
			Limit:     g.limit,
			Duration:  1000, // milliseconds
			Burst:     g.burst,
			Algorithm: gubernator.Algorithm_LEAKY_BUCKET,
			Behavior:  g.behavior,
		}},
	})
	if err != nil {
		return false, err
	}
	r := resp.Responses[0]
	if r.Error != "" {
		return false, errors.New(r.Error)
	}
	return r.Status == gubernator.Status_UNDER_LIMIT, nil
}

// ---- x/time/rate keyed, unshared: the in-process reference

// xrateSystem is a map of x/time/rate limiters under one mutex in one
// process: not distributed at all (node is ignored), the throughput a
// distributed limiter's hot path is held to.
type xrateSystem struct {
	mu sync.Mutex
	m  map[string]*rate.Limiter
}

func newXRateSystem() *xrateSystem {
	return &xrateSystem{m: make(map[string]*rate.Limiter)}
}

// Allow implements system. The clock is read under the mutex: x/time/rate
// takes a time older than the limiter's last as the new last, so callers
// whose reads reach it out of order would regain the same tokens twice
// (over the hot identity's 3 s, tens of admissions above burst + rate·Δ on
// a loaded machine).
func (x *xrateSystem) Allow(_ context.Context, _ int, key string) (bool, error) {
	x.mu.Lock()
	now := time.Now()
	lim, ok := x.m[key]
	if !ok {
		lim = rate.NewLimiter(ruleLimit, ruleBurst)
		x.m[key] = lim
	}
	a := lim.AllowN(now, 1)
	x.mu.Unlock()
	return a, nil
}

package region

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/weir-dev/weir/cluster"
	"github.com/weir-dev/weir/quota"
	"github.com/weir-dev/weir/sim/engine"
)

// Traffic kinds (Config.Traffic).
const (
	// TrafficConstant: each identity offers Load × its rule's rate, evenly
	// spaced, round-robin over the nodes.
	TrafficConstant = "constant"
	// TrafficSaturate: every node offers Load × the rate for each identity
	// on its own: the client that saturates every node carrying its traffic
	// (docs/overshoot.md's lower bound).
	TrafficSaturate = "saturate"
	// TrafficBursty: once per window each identity sends Load × the limit
	// in one burst spread over the first tenth of the window.
	TrafficBursty = "bursty"
	// TrafficOneNode: all of an identity's traffic arrives at one node that
	// does not own it.
	TrafficOneNode = "onenode"
	// TrafficUneven: an identity's traffic is spread 80/15/5 over three
	// nodes, the busiest a non-owner.
	TrafficUneven = "uneven"
	// TrafficPoisson: Poisson arrivals at Load × the rate per identity, at
	// nodes drawn uniformly.
	TrafficPoisson = "poisson"
	// TrafficZipf: Poisson arrivals at Rate decisions per second in all,
	// each for an identity drawn from a Zipf distribution (exponent
	// ZipfS) over IDs identities, at nodes drawn uniformly.
	TrafficZipf = "zipf"
	// TrafficPulse: the sketch's adversary. From the start of every
	// period (the sketch period, or the window without one) each
	// identity saturates every node (Load × the rate each), then is quiet
	// long enough for its entries to be dropped (pulseQuiet), so that
	// the next period meets it on every node as a stranger again.
	TrafficPulse = "pulse"
)

// TrafficKinds lists the traffic kinds.
var TrafficKinds = []string{TrafficConstant, TrafficSaturate, TrafficBursty, TrafficOneNode, TrafficUneven, TrafficPoisson, TrafficZipf, TrafficPulse}

// Config is one simulated run: a region of Nodes gateways enforcing one
// GCRA rule under Traffic, with Faults. The zero values of the optional
// fields are the production defaults (shell.Config and
// cluster.CoordinatorConfig).
type Config struct {
	// Nodes is the number of gateways at the start (n0 ... n{Nodes-1}).
	Nodes int
	// The rule: Limit tokens per Window, capacity Burst (0: Limit), Mode
	// shared or exact, Accuracy a (0: quota.DefaultAccuracy), OnFailure
	// ("": local), Cost per request (0: 1).
	Limit     int64
	Window    time.Duration
	Burst     int64
	Mode      quota.Mode
	Accuracy  float64
	OnFailure quota.OnFailure
	Cost      int64
	// Algorithm is the rule's algorithm ("": gcra), or one of
	// SimAlgorithms in mode exact (algorithms.go): the run is then held to
	// equality with one instance of the algorithm, not to the envelope.
	Algorithm quota.Algorithm
	// Hold is how long a concurrency rule's admitted request is held
	// before its release (0: 20ms); the rule's Limit is its slots and its
	// Window the longest a slot is held without its release. Traffic then
	// offers Load × Limit ÷ Hold requests per second per identity: Load ×
	// Limit in flight.
	Hold time.Duration
	// Sketch is the rule's sketch gating threshold θ (quota.Sketch,
	// docs/overshoot.md "Sketch gating"; 0: no gating, shared mode only)
	// and SketchPeriod its period P (0: Window; at least Window). Each
	// node's sketch hashes with a seed drawn from the run's random source.
	Sketch       int64
	SketchPeriod time.Duration
	// KeyCap is every coordinator's key cap (cluster.CoordinatorConfig
	// MaxKeys: entries per rule per node; 0: the coordinator's default).
	KeyCap int
	// TrackAll keeps an entry of every identity on every node of a
	// shared rule (cluster.RuleParams.TrackAll): no blind spend.
	TrackAll bool
	// Rules are rules every request carries after the main one (nil: the
	// main rule only). Each node then decides a request with the request
	// policy (internal/policy): cluster rules charged one by one, a
	// rejection refunding those admitted before it; and each rule's
	// envelope is checked on its own (rules.go). Sketch gating and the key
	// cap are simulated with one rule only, and so is the lower bound.
	Rules []RuleSpec
	// Scheme is the rule's slack scheme, "fixed" or "demand" (""
	// : cluster.DefaultSlackScheme).
	Scheme string
	// Sync is the coordinator's sync interval (0: cluster.DefaultSyncInterval).
	Sync time.Duration
	// DecideTimeout bounds a forwarded request (0: cluster.DefaultDecideTimeout).
	DecideTimeout time.Duration
	// Linger, CallTimeout, BreakerFailures, BreakerCooldown are the
	// Shell's (0: 200µs, 200ms, 3, 1s).
	Linger          time.Duration
	CallTimeout     time.Duration
	BreakerFailures int
	BreakerCooldown time.Duration
	// Tick is how often each node's Tick runs (0: 10ms, the Shell's). A
	// larger tick makes big runs faster; the sync interval and the decide
	// timeout are then kept to tick resolution.
	Tick time.Duration
	// Detect is how long membership takes to declare a crashed or
	// unreachable node dead (0: 500ms); Gossip how long a join, a leave or
	// a healed partition takes to reach a node (0: 50ms). Each node draws
	// its own delay uniformly in [d/2, d], so views converge one by one.
	Detect, Gossip time.Duration
	// Latency is the one-way latency (nil: lognormal, median 200µs, sigma
	// 0.5); a latency fault replaces it.
	Latency engine.Latency
	// Traffic is one of TrafficKinds (default constant). Load is the
	// offered rate per identity as a multiple of the rule's rate (0: 3);
	// IDs the number of identities (0: 1, or 1000 for zipf); Rate the
	// total decisions per second of zipf traffic (0: Load × rate × IDs ÷
	// 10); ZipfS the Zipf exponent (0: 1.1, must be > 1).
	Traffic string
	Load    float64
	IDs     int
	Rate    float64
	ZipfS   float64
	// Faults are injected in order of time.
	Faults []Fault
	// Duration is the simulated time traffic runs (0: 10s).
	Duration time.Duration
	// Seed seeds the run's only random source.
	Seed uint64
	// Bin is the width of the time bins of the rate series (0: one
	// second, or a round step coarser or finer by the run's duration and
	// the rule's rate: see plotBin).
	Bin time.Duration
	// Progress, when set, is called about every tenth of the run with the
	// simulated time done and the total.
	Progress func(done, total time.Duration)
	// Log, when set, receives a line per fault and membership change.
	Log io.Writer
}

// withDefaults returns c with its zero values filled in.
func (c Config) withDefaults() Config {
	if c.Nodes == 0 {
		c.Nodes = 3
	}
	if c.Limit == 0 {
		c.Limit = 100
	}
	if c.Window == 0 {
		c.Window = time.Second
	}
	if c.Burst == 0 {
		c.Burst = c.Limit
	}
	if c.Algorithm == "" {
		c.Algorithm = quota.AlgorithmGCRA
	}
	if c.Algorithm == quota.AlgorithmConcurrency && c.Hold == 0 {
		c.Hold = 20 * time.Millisecond
	}
	if c.Mode == "" {
		c.Mode = quota.ModeShared
		if c.Algorithm != quota.AlgorithmGCRA {
			c.Mode = quota.ModeExact
		}
	}
	if c.Accuracy == 0 {
		c.Accuracy = quota.DefaultAccuracy
	}
	if c.OnFailure == "" {
		c.OnFailure = quota.OnFailureLocal
	}
	if c.Cost == 0 {
		c.Cost = 1
	}
	if c.Scheme == "" {
		c.Scheme = cluster.DefaultSlackScheme.String()
	}
	if c.Sync == 0 {
		c.Sync = cluster.DefaultSyncInterval
	}
	if c.DecideTimeout == 0 {
		c.DecideTimeout = cluster.DefaultDecideTimeout
	}
	if c.Linger == 0 {
		c.Linger = 200 * time.Microsecond
	}
	if c.CallTimeout == 0 {
		c.CallTimeout = 200 * time.Millisecond
	}
	if c.BreakerFailures == 0 {
		c.BreakerFailures = 3
	}
	if c.BreakerCooldown == 0 {
		c.BreakerCooldown = time.Second
	}
	if c.Tick == 0 {
		c.Tick = 10 * time.Millisecond
	}
	if c.Detect == 0 {
		c.Detect = 500 * time.Millisecond
	}
	if c.Gossip == 0 {
		c.Gossip = 50 * time.Millisecond
	}
	if c.Latency == nil {
		c.Latency = engine.LogNormal{Median: 200 * time.Microsecond, Sigma: 0.5}
	}
	if c.Traffic == "" {
		c.Traffic = TrafficConstant
	}
	if c.Load == 0 {
		c.Load = 3
	}
	if c.IDs == 0 {
		c.IDs = 1
		if c.Traffic == TrafficZipf {
			c.IDs = 1000
		}
	}
	if c.ZipfS == 0 {
		c.ZipfS = 1.1
	}
	if c.Rate == 0 && c.Traffic == TrafficZipf {
		c.Rate = c.Load * c.rate() * float64(c.IDs) / 10
	}
	if c.Duration == 0 {
		c.Duration = 10 * time.Second
	}
	if c.Sketch > 0 && c.SketchPeriod == 0 {
		c.SketchPeriod = c.Window
	}
	if c.Bin == 0 {
		c.Bin = plotBin(c.Duration, c.rate())
	}
	return c
}

// rate is the rule's rate in tokens per second.
func (c *Config) rate() float64 {
	if c.Algorithm == quota.AlgorithmConcurrency {
		return float64(c.Limit) / c.Hold.Seconds() // Limit in flight
	}
	return float64(c.Limit) / c.Window.Seconds()
}

// Validate checks c (after defaults) and returns an error naming the field
// that is wrong.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.Nodes < 1 || c.Nodes > 10000:
		return fmt.Errorf("nodes %d: want 1..10000", c.Nodes)
	case c.Limit < 1:
		return fmt.Errorf("limit %d: want >= 1", c.Limit)
	case c.Window <= 0:
		return fmt.Errorf("window %v: want > 0", c.Window)
	case c.Burst < 1:
		return fmt.Errorf("burst %d: want >= 1", c.Burst)
	case c.Mode != quota.ModeShared && c.Mode != quota.ModeExact:
		return fmt.Errorf("mode %q: want shared or exact", c.Mode)
	case c.Accuracy <= 0 || c.Accuracy > 0.5:
		return fmt.Errorf("accuracy %g: want (0, 0.5]", c.Accuracy)
	case c.OnFailure != quota.OnFailureLocal && c.OnFailure != quota.OnFailureOpen && c.OnFailure != quota.OnFailureClosed:
		return fmt.Errorf("on-failure %q: want local, open or closed", c.OnFailure)
	case c.Cost < 1 || c.Cost > c.Burst:
		return fmt.Errorf("cost %d: want 1..burst (%d)", c.Cost, c.Burst)
	case c.Sync < 0 || c.DecideTimeout < 0 || c.Linger < 0 || c.CallTimeout < 0 || c.BreakerCooldown < 0 || c.Tick < 0:
		return fmt.Errorf("durations must not be negative")
	case c.Detect < 0 || c.Gossip < 0:
		return fmt.Errorf("detect/gossip: must not be negative")
	case !slices.Contains(TrafficKinds, c.Traffic):
		return fmt.Errorf("traffic %q: want one of %s", c.Traffic, strings.Join(TrafficKinds, ", "))
	case c.Load <= 0 || math.IsInf(c.Load, 0) || math.IsNaN(c.Load):
		return fmt.Errorf("load %g: want > 0", c.Load)
	case c.IDs < 1 || c.IDs > 10_000_000:
		return fmt.Errorf("ids %d: want 1..10000000", c.IDs)
	case c.Rate < 0 || math.IsNaN(c.Rate):
		return fmt.Errorf("rate %g: want >= 0", c.Rate)
	case c.ZipfS <= 1:
		return fmt.Errorf("zipf exponent %g: want > 1", c.ZipfS)
	case c.Duration <= 0:
		return fmt.Errorf("duration %v: want > 0", c.Duration)
	case c.KeyCap < 0:
		return fmt.Errorf("keycap %d: want 0 (the default) or more", c.KeyCap)
	case c.Sketch < 0 || c.Sketch > quota.MaxSketchThreshold:
		return fmt.Errorf("sketch %d: want 0 (off) or 1..%d", c.Sketch, quota.MaxSketchThreshold)
	case c.Sketch > 0 && c.Mode != quota.ModeShared:
		return fmt.Errorf("sketch %d: gating needs mode shared, not %s", c.Sketch, c.Mode)
	case c.Sketch > 0 && c.SketchPeriod < c.Window:
		return fmt.Errorf("sketch period %v: want at least the window %v", c.SketchPeriod, c.Window)
	case c.Traffic == TrafficPulse && c.pulseQuiet() >= c.pulsePeriod():
		return fmt.Errorf("traffic pulse: the quiet part %v (B·T + 2·sync + decide timeout + 4 ticks) leaves nothing of the period %v: raise -sketch-period or lower -burst",
			time.Duration(c.pulseQuiet()), time.Duration(c.pulsePeriod()))
	}
	if err := c.validateAlgorithm(); err != nil {
		return err
	}
	if _, err := bucketFor(c); err != nil {
		return err
	}
	if err := c.validateRules(); err != nil {
		return err
	}
	return checkFaultOrder(c.Nodes, c.Faults)
}

// checkFaultOrder replays the faults in time order against which nodes are
// up, and names the first that makes no sense (restart of a node that is
// up, crash of a node that is down, a join of a node already in, ...).
func checkFaultOrder(nodes int, faults []Fault) error {
	up := map[string]bool{}
	known := map[string]bool{}
	for i := range nodes {
		up[nodeName(i)] = true
		known[nodeName(i)] = true
	}
	for _, f := range sortFaults(faults) {
		switch f.Kind {
		case FaultCrash, FaultLeave:
			if !up[f.Node] {
				return fmt.Errorf("%w: %q: %s is not running then", ErrFaultSpec, f.Text, f.Node)
			}
			up[f.Node] = false
		case FaultRestart:
			if !known[f.Node] {
				return fmt.Errorf("%w: %q: %s was never started (use join)", ErrFaultSpec, f.Text, f.Node)
			}
			if up[f.Node] {
				return fmt.Errorf("%w: %q: %s is running then (crash it first)", ErrFaultSpec, f.Text, f.Node)
			}
			up[f.Node] = true
		case FaultJoin:
			if up[f.Node] {
				return fmt.Errorf("%w: %q: %s is already in the cluster", ErrFaultSpec, f.Text, f.Node)
			}
			if !known[f.Node] && nodeIndex(f.Node) != len(known) {
				return fmt.Errorf("%w: %q: a new node must be n%d, the next one", ErrFaultSpec, f.Text, len(known))
			}
			up[f.Node], known[f.Node] = true, true
		case FaultSkew:
			if !known[f.Node] {
				return fmt.Errorf("%w: %q: no node %s", ErrFaultSpec, f.Text, f.Node)
			}
		case FaultPartition:
			for _, g := range f.Groups {
				for _, n := range g {
					if nodeIndex(n) >= nodes+countJoins(faults) {
						return fmt.Errorf("%w: %q: no node %s", ErrFaultSpec, f.Text, n)
					}
				}
			}
		}
	}
	return nil
}

func countJoins(faults []Fault) int {
	seen := map[string]bool{}
	for _, f := range faults {
		if f.Kind == FaultJoin {
			seen[f.Node] = true
		}
	}
	return len(seen)
}

// sortFaults returns the faults in time order (stable for equal times).
func sortFaults(fs []Fault) []Fault {
	out := slices.Clone(fs)
	slices.SortStableFunc(out, func(a, b Fault) int { return int(a.At - b.At) })
	return out
}

func nodeName(i int) string { return "n" + strconv.Itoa(i) }

// Flags returns the command-line flags of `go run ./sim` that reproduce c.
func (c Config) Flags() string {
	c = c.withDefaults()
	var b strings.Builder
	fmt.Fprintf(&b, "-nodes %d -limit %d -window %v -burst %d -mode %s -accuracy %g -scheme %s -on-failure %s -cost %d",
		c.Nodes, c.Limit, c.Window, c.Burst, c.Mode, c.Accuracy, c.Scheme, c.OnFailure, c.Cost)
	if c.Algorithm != quota.AlgorithmGCRA {
		fmt.Fprintf(&b, " -algorithm %s", c.Algorithm)
	}
	if c.Algorithm == quota.AlgorithmConcurrency {
		fmt.Fprintf(&b, " -hold %v", c.Hold)
	}
	fmt.Fprintf(&b, " -sync %v -decide-timeout %v -linger %v -call-timeout %v -breaker-failures %d -breaker-cooldown %v",
		c.Sync, c.DecideTimeout, c.Linger, c.CallTimeout, c.BreakerFailures, c.BreakerCooldown)
	fmt.Fprintf(&b, " -tick %v -detect %v -gossip %v -latency %s", c.Tick, c.Detect, c.Gossip, c.Latency)
	fmt.Fprintf(&b, " -traffic %s -load %g -ids %d", c.Traffic, c.Load, c.IDs)
	if c.Traffic == TrafficZipf {
		fmt.Fprintf(&b, " -rate %g -zipf %g", c.Rate, c.ZipfS)
	}
	if c.Sketch > 0 {
		fmt.Fprintf(&b, " -sketch %d -sketch-period %v", c.Sketch, c.SketchPeriod)
	}
	if c.KeyCap > 0 {
		fmt.Fprintf(&b, " -keycap %d", c.KeyCap)
	}
	if c.TrackAll {
		fmt.Fprintf(&b, " -track-all")
	}
	if len(c.Rules) > 0 {
		fmt.Fprintf(&b, " -rules '%s'", FormatRules(c.Rules))
	}
	fmt.Fprintf(&b, " -faults '%s' -duration %v -seed %d", FormatFaults(c.Faults), c.Duration, c.Seed)
	return b.String()
}

package global

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/weir-dev/weir/lease"
	"github.com/weir-dev/weir/sim/engine"
)

// Demand kinds (Config.Demand).
const (
	// DemandConstant: every identity offers Load × its limit in all, split
	// evenly over the regions, in evenly spaced requests.
	DemandConstant = "constant"
	// DemandPoisson: the rates of DemandConstant, Poisson arrivals.
	DemandPoisson = "poisson"
	// DemandBursty: the rates of DemandConstant, but each region sends a
	// whole second's requests at once, once a second.
	DemandBursty = "bursty"
	// DemandMove: all of an identity's demand (Load × its limit) is in one
	// region, and moves to the next region every MoveEvery; identity i
	// starts in region i mod Regions.
	DemandMove = "move"
	// DemandSchedule: the rates of Config.Schedule, evenly spaced.
	DemandSchedule = "schedule"
	// DemandDoorman: Doorman's scenario seven (see doorman.go): 45 clients
	// whose wants take a random walk, with spikes.
	DemandDoorman = "doorman"
)

// DemandKinds lists the demand kinds.
var DemandKinds = []string{DemandConstant, DemandPoisson, DemandBursty, DemandMove, DemandSchedule, DemandDoorman}

// Fallback policies (Config.Fallback): what a region enforces while its
// Holder reports the fallback (no lease yet, or an expired one).
const (
	// FallbackShare enforces min(safe share, last share), 0 before the
	// first lease (the default of lease.Regional).
	FallbackShare = "share"
	// FallbackOpen admits everything while in fallback; such admissions
	// are counted as degraded and kept out of the envelope.
	FallbackOpen = "open"
	// FallbackClosed rejects everything while in fallback.
	FallbackClosed = "closed"
)

// Shift is one step of a demand schedule: from At on, region Region
// offers Rate tokens per window for every identity.
type Shift struct {
	At     time.Duration
	Region int
	Rate   float64
}

// Config is one simulated run of a global rule across Regions regions.
// Zero durations take the defaults documented on each field.
type Config struct {
	// Regions is the number of regions, r0 ... r{Regions-1} (2 to 24).
	Regions int
	// The global rule: Limit tokens per Window, global burst Burst (0:
	// Limit ÷ 10, at least Regions × Cost), Cost per request (0: 1), and
	// the accuracy a of the in-region cluster (0: 0.05): each region's
	// in-region slack is S_r = ⌊a·share_r⌋.
	Limit    int64
	Window   time.Duration
	Burst    int64
	Cost     int64
	Accuracy float64
	// IDs is the number of global identities (0: 1), each with its own
	// leases, buckets and checks.
	IDs int
	// Refresh is how often each region's owner reports (0: 1s). Lease is
	// the lease duration (0: lease.DefaultLeaseDuration), MaxSkew the
	// machine's skew margin (0: lease.DefaultMaxSkew), Tick how often the
	// leader proposes Tick (0: 1s).
	Refresh, Lease, MaxSkew, Tick time.Duration
	// Skew is the spread of the clocks: each region's and each leader's
	// clock is off the true time by a constant drawn from [−Skew/2,
	// Skew/2], so two clocks differ by at most Skew (0: none; at most
	// MaxSkew).
	Skew time.Duration
	// Sync is the in-region sync interval: slack spend is charged to the
	// region's bucket this often (0: 100ms).
	Sync time.Duration
	// Election is how long after a leader crash a new leader takes over
	// (0: 2s); Commit is the time from a report's arrival at the leader to
	// its reply (one Raft commit round, 0: 80ms).
	Election, Commit time.Duration
	// Latency is the one-way delay of every cross-region message (nil:
	// lognormal, median 40ms, σ 0.3).
	Latency engine.Latency
	// Demand is the demand kind (DemandKinds, "": constant); Load the
	// offered demand per identity as a multiple of its limit (0: 1.5);
	// MoveEvery the period of DemandMove (0: 20s); Schedule the steps of
	// DemandSchedule.
	Demand    string
	Load      float64
	MoveEvery time.Duration
	Schedule  []Shift
	// Poisson makes the arrivals of DemandConstant, DemandMove and
	// DemandSchedule Poisson at their rates instead of evenly spaced (as
	// DemandPoisson's are): the demand a region measures over a report's
	// period is then noisy, as real clients' is.
	Poisson bool
	// DoormanClients is the number of Doorman clients per region under
	// DemandDoorman (0: 45 ÷ Regions).
	DoormanClients int
	// Fallback is the policy while a region is in fallback ("": share).
	Fallback string
	// Faults are injected in the run.
	Faults []Fault
	// Duration is the simulated time; Warmup the start excluded from the
	// averages (0: Lease); Sample how often shares are sampled (0: 1s).
	Duration, Warmup, Sample time.Duration
	// Seed names the run: the same Config prints the same bytes.
	Seed uint64
	// Breakdown measures where the capacity is over time (see
	// breakdown.go) and prints it after the summary.
	Breakdown bool

	// probe, for tests, is called at every sample with the time since the
	// start and, in each region, identity 0's share and whether it enforces
	// its fallback because a lease it held expired (Regional.Expired; a
	// region waiting for its first grant has not fallen back).
	probe func(at time.Duration, share []int64, fallback []bool)
}

func (c Config) withDefaults() Config {
	or := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if c.Window == 0 {
		c.Window = time.Second
	}
	if c.Cost == 0 {
		c.Cost = 1
	}
	if c.Burst == 0 {
		c.Burst = max(c.Limit/10, int64(c.Regions)*c.Cost)
	}
	if c.Accuracy == 0 {
		c.Accuracy = 0.05
	}
	if c.IDs == 0 {
		c.IDs = 1
	}
	or(&c.Refresh, time.Second)
	or(&c.Lease, lease.DefaultLeaseDuration)
	or(&c.MaxSkew, lease.DefaultMaxSkew)
	or(&c.Tick, time.Second)
	or(&c.Sync, 100*time.Millisecond)
	or(&c.Election, 2*time.Second)
	or(&c.Commit, 80*time.Millisecond)
	or(&c.MoveEvery, 20*time.Second)
	or(&c.Warmup, c.Lease)
	or(&c.Sample, time.Second)
	if c.Latency == nil {
		c.Latency = engine.LogNormal{Median: 40 * time.Millisecond, Sigma: 0.3}
	}
	if c.Demand == "" {
		c.Demand = DemandConstant
	}
	if c.Load == 0 {
		c.Load = 1.5
	}
	if c.Fallback == "" {
		c.Fallback = FallbackShare
	}
	if c.Demand == DemandDoorman && c.DoormanClients == 0 && c.Regions > 0 {
		c.DoormanClients = max(45/c.Regions, 1)
	}
	return c
}

// Validate reports the first field that cannot be simulated, by name.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.Regions < 2 || c.Regions > 24:
		return fmt.Errorf("regions %d: want 2 to 24", c.Regions)
	case c.Limit < 1:
		return fmt.Errorf("limit %d: want at least 1", c.Limit)
	case c.Window <= 0:
		return fmt.Errorf("window %v: want > 0", c.Window)
	case c.Cost < 1:
		return fmt.Errorf("cost %d: want at least 1", c.Cost)
	case c.Burst/int64(c.Regions) < c.Cost:
		return fmt.Errorf("burst %d: over %d regions a share's burst is below the cost %d", c.Burst, c.Regions, c.Cost)
	case c.Accuracy < 0 || c.Accuracy > 0.5:
		return fmt.Errorf("accuracy %g: want 0 to 0.5", c.Accuracy)
	case c.IDs < 1 || c.IDs > 10000:
		return fmt.Errorf("ids %d: want 1 to 10000", c.IDs)
	case c.Refresh <= 0 || c.Tick <= 0 || c.Sync <= 0 || c.Sample <= 0:
		return errors.New("refresh, tick, sync and sample must be positive")
	case c.MaxSkew >= c.Lease:
		return fmt.Errorf("max-skew %v: must be shorter than the lease %v", c.MaxSkew, c.Lease)
	case c.Refresh >= c.Lease-c.MaxSkew:
		return fmt.Errorf("refresh %v: must be shorter than the lease %v less the skew margin %v", c.Refresh, c.Lease, c.MaxSkew)
	case c.Skew < 0 || c.Skew > c.MaxSkew:
		return fmt.Errorf("skew %v: want 0 to max-skew %v", c.Skew, c.MaxSkew)
	case c.Load < 0:
		return fmt.Errorf("load %g: want >= 0", c.Load)
	case !slices.Contains(DemandKinds, c.Demand):
		return fmt.Errorf("demand %q: want one of %s", c.Demand, strings.Join(DemandKinds, ", "))
	case c.Demand == DemandSchedule && len(c.Schedule) == 0:
		return errors.New("demand schedule: -schedule is empty")
	case c.Poisson && (c.Demand == DemandBursty || c.Demand == DemandDoorman):
		return fmt.Errorf("poisson: demand %s has arrivals of its own", c.Demand)
	case c.Fallback != FallbackShare && c.Fallback != FallbackOpen && c.Fallback != FallbackClosed:
		return fmt.Errorf("fallback %q: want share, open or closed", c.Fallback)
	case c.Duration <= 0:
		return fmt.Errorf("duration %v: want > 0", c.Duration)
	case c.Limit > int64(c.Window):
		return fmt.Errorf("limit %d: more than one token per ns of the window", c.Limit)
	}
	for _, s := range c.Schedule {
		if s.Region < 0 || s.Region >= c.Regions || s.Rate < 0 || s.At < 0 {
			return fmt.Errorf("schedule: step %s: region out of range, or negative rate or time", formatShift(s))
		}
	}
	for _, f := range c.Faults {
		if f.Kind == FaultPartition && (f.Region < 0 || f.Region >= c.Regions) {
			return fmt.Errorf("faults: %s: no region r%d", f.Text, f.Region)
		}
	}
	return nil
}

// Flags returns the flags of `go run ./sim -global` that reproduce the run.
func (c Config) Flags() string {
	d := c.withDefaults()
	var b strings.Builder
	fmt.Fprintf(&b, "-global -regions %d -limit %d -window %v -burst %d -cost %d -accuracy %g -ids %d", d.Regions, d.Limit, d.Window, d.Burst, d.Cost, d.Accuracy, d.IDs)
	fmt.Fprintf(&b, " -refresh %v -lease %v -max-skew %v -skew %v -tick %v -sync %v -election %v -commit %v -latency %s",
		d.Refresh, d.Lease, d.MaxSkew, d.Skew, d.Tick, d.Sync, d.Election, d.Commit, d.Latency)
	fmt.Fprintf(&b, " -demand %s -load %g", d.Demand, d.Load)
	if d.Demand == DemandMove {
		fmt.Fprintf(&b, " -move-every %v", d.MoveEvery)
	}
	if d.Demand == DemandSchedule {
		fmt.Fprintf(&b, " -schedule '%s'", FormatSchedule(d.Schedule))
	}
	if d.Demand == DemandDoorman {
		fmt.Fprintf(&b, " -doorman-clients %d", d.DoormanClients)
	}
	if d.Poisson {
		b.WriteString(" -poisson")
	}
	fmt.Fprintf(&b, " -fallback %s -faults '%s' -duration %v -warmup %v -sample %v -seed %d", d.Fallback, FormatFaults(d.Faults), d.Duration, d.Warmup, d.Sample, d.Seed)
	if d.Breakdown {
		b.WriteString(" -breakdown")
	}
	return b.String()
}

// ScheduleSyntax documents -schedule.
const ScheduleSyntax = `A schedule is steps separated by ";": TIME=RATE,RATE,... gives each region's rate
(tokens per window, per identity) from TIME on; the first step should be at 0s.
  0s=300,100,0;20s=0,100,300`

// ParseSchedule parses a schedule (ScheduleSyntax).
func ParseSchedule(s string) ([]Shift, error) {
	var out []Shift
	for step := range strings.SplitSeq(strings.TrimSpace(s), ";") {
		step = strings.TrimSpace(step)
		if step == "" {
			continue
		}
		at, rates, ok := strings.Cut(step, "=")
		if !ok {
			return nil, fmt.Errorf("schedule step %q: want TIME=RATE,...", step)
		}
		t, err := time.ParseDuration(at)
		if err != nil {
			return nil, fmt.Errorf("schedule step %q: %v", step, err)
		}
		for i, v := range strings.Split(rates, ",") {
			r, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil || r < 0 || math.IsInf(r, 0) || math.IsNaN(r) {
				return nil, fmt.Errorf("schedule step %q: rate %q: want a number >= 0", step, v)
			}
			out = append(out, Shift{At: t, Region: i, Rate: r})
		}
	}
	return out, nil
}

// FormatSchedule is the inverse of ParseSchedule.
func FormatSchedule(s []Shift) string {
	var b strings.Builder
	for i, sh := range s {
		if i == 0 || sh.At != s[i-1].At {
			if i > 0 {
				b.WriteByte(';')
			}
			fmt.Fprintf(&b, "%v=", sh.At)
		} else {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%g", sh.Rate)
	}
	return b.String()
}

func formatShift(s Shift) string { return fmt.Sprintf("%v:r%d=%g", s.At, s.Region, s.Rate) }

// ParseLatency parses const:D, uniform:D1:D2 or lognormal:MEDIAN:SIGMA.
func ParseLatency(s string) (engine.Latency, error) {
	p := strings.Split(s, ":")
	dur := func(x string) (time.Duration, error) {
		d, err := time.ParseDuration(x)
		if err != nil || d < 0 {
			return 0, fmt.Errorf("latency %q: %q is not a duration >= 0", s, x)
		}
		return d, nil
	}
	switch {
	case p[0] == "const" && len(p) == 2:
		d, err := dur(p[1])
		return engine.Const{D: d}, err
	case p[0] == "uniform" && len(p) == 3:
		a, err := dur(p[1])
		if err != nil {
			return nil, err
		}
		b, err := dur(p[2])
		return engine.Uniform{Lo: a, Hi: b}, err
	case p[0] == "lognormal" && len(p) == 3:
		m, err := dur(p[1])
		if err != nil {
			return nil, err
		}
		sg, err := strconv.ParseFloat(p[2], 64)
		if err != nil || sg < 0 {
			return nil, fmt.Errorf("latency %q: sigma %q: want a number >= 0", s, p[2])
		}
		return engine.LogNormal{Median: m, Sigma: sg}, nil
	}
	return nil, fmt.Errorf("latency %q: want const:D, uniform:D1:D2 or lognormal:MEDIAN:SIGMA", s)
}

// FaultKind names a kind of fault.
type FaultKind uint8

// The fault kinds (FaultSyntax).
const (
	FaultPartition FaultKind = iota + 1
	FaultLeader
	FaultLoss
)

// FaultSyntax documents -faults.
const FaultSyntax = `A fault spec is items separated by "," ("" or "none": no fault); times from the start:
  partition:rK@T1-T2   region K reaches neither the leader nor anyone from T1 to T2: it keeps
                       its lease, then falls back
  leader@T             the leader crashes at T; another voter takes over after -election, its
                       clock off by up to -skew
  loss:P[@T1-T2]       each message is lost with probability P, in the window or always`

// Fault is one item of a fault spec.
type Fault struct {
	Kind   FaultKind
	Region int
	At     time.Duration
	End    time.Duration // partition, windowed loss; 0: to the end
	Loss   float64
	Text   string
}

// ParseFaults parses a fault spec (FaultSyntax).
func ParseFaults(spec string) ([]Fault, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" || spec == "none" {
		return nil, nil
	}
	var out []Fault
	for it := range strings.SplitSeq(spec, ",") {
		it = strings.TrimSpace(it)
		f, err := parseFault(it)
		if err != nil {
			return nil, fmt.Errorf("fault %q: %w", it, err)
		}
		out = append(out, f)
	}
	return out, nil
}

func parseWindow(s string) (time.Duration, time.Duration, error) {
	a, b, ok := strings.Cut(s, "-")
	t1, err := time.ParseDuration(a)
	if err != nil {
		return 0, 0, err
	}
	if !ok {
		return t1, 0, nil
	}
	t2, err := time.ParseDuration(b)
	if err != nil {
		return 0, 0, err
	}
	if t2 <= t1 {
		return 0, 0, fmt.Errorf("window %s ends before it starts", s)
	}
	return t1, t2, nil
}

func parseFault(it string) (Fault, error) {
	f := Fault{Text: it}
	body, when, hasAt := strings.Cut(it, "@")
	kind, arg, _ := strings.Cut(body, ":")
	switch kind {
	case "partition":
		f.Kind = FaultPartition
		if !strings.HasPrefix(arg, "r") {
			return f, errors.New("want partition:rK@T1-T2")
		}
		k, err := strconv.Atoi(arg[1:])
		if err != nil || k < 0 {
			return f, errors.New("want partition:rK@T1-T2")
		}
		f.Region = k
		if !hasAt {
			return f, errors.New(`missing "@T1-T2"`)
		}
		a, b, err := parseWindow(when)
		if err != nil || b == 0 {
			return f, errors.New("want a window T1-T2")
		}
		f.At, f.End = a, b
	case "leader":
		f.Kind = FaultLeader
		if !hasAt || arg != "" {
			return f, errors.New("want leader@T")
		}
		a, b, err := parseWindow(when)
		if err != nil || b != 0 {
			return f, errors.New("want leader@T")
		}
		f.At = a
	case "loss":
		f.Kind = FaultLoss
		p, err := strconv.ParseFloat(arg, 64)
		if err != nil || p < 0 || p > 1 {
			return f, errors.New("want loss:P with P in [0, 1]")
		}
		f.Loss = p
		if hasAt {
			a, b, err := parseWindow(when)
			if err != nil || b == 0 {
				return f, errors.New("want loss:P@T1-T2")
			}
			f.At, f.End = a, b
		}
	default:
		return f, fmt.Errorf("unknown kind %q (partition, leader, loss)", kind)
	}
	return f, nil
}

// FormatFaults is the inverse of ParseFaults.
func FormatFaults(fs []Fault) string {
	if len(fs) == 0 {
		return "none"
	}
	parts := make([]string, len(fs))
	for i, f := range fs {
		parts[i] = f.Text
	}
	return strings.Join(parts, ",")
}

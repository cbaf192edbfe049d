package region

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/weir-dev/weir/sim/engine"
)

// FaultKind names a kind of fault.
type FaultKind uint8

// The fault kinds of the fault spec (see FaultSyntax).
const (
	FaultCrash FaultKind = iota + 1
	FaultRestart
	FaultLeave
	FaultJoin
	FaultPartition
	FaultLoss
	FaultLatency
	FaultSkew
)

var kindNames = map[string]FaultKind{
	"crash": FaultCrash, "restart": FaultRestart, "leave": FaultLeave, "join": FaultJoin,
	"partition": FaultPartition, "loss": FaultLoss, "latency": FaultLatency, "skew": FaultSkew,
}

// String returns the kind's name in the spec.
func (k FaultKind) String() string {
	for _, n := range sortedKinds() {
		if kindNames[n] == k {
			return n
		}
	}
	return fmt.Sprintf("FaultKind(%d)", k)
}

func sortedKinds() []string {
	names := make([]string, 0, len(kindNames))
	for n := range kindNames {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// FaultSyntax documents the fault spec; -help prints it.
const FaultSyntax = `A fault spec is a list of items separated by "," or ";" ("" or "none": no fault).
Times are Go durations from the start of the run; nodes are n0, n1, ...
  crash:NODE@T            NODE stops at T and loses all state
  restart:NODE@T          a crashed NODE starts again at T, empty, with a larger incarnation
  leave:NODE@T            NODE leaves gracefully at T (hands its buckets off, then stops)
  join:NODE@T             NODE (one past the initial nodes, or one that left) joins at T
  partition:G|G...@T1-T2  the groups cannot reach each other from T1 to T2; a group is
                          NODE[,NODE...]; nodes in no group form one more group together
  loss:P[@T1-T2]          each message is lost with probability P (0..1), in the window or always
  latency:DIST            one-way latency: const:D | uniform:D1:D2 | lognormal:MEDIAN:SIGMA
  skew:NODE:±D[@T]        NODE's clock runs D ahead (+) or behind (-): from the start,
                          or as a step at T
Example: crash:n1@10s,restart:n1@20s,partition:n0|n1,n2@5s-8s,loss:0.01,latency:lognormal:200us:0.5`

// Fault is one item of a fault spec.
type Fault struct {
	Kind FaultKind
	// Node is the node of a crash, restart, leave, join or skew.
	Node string
	// Groups are the sides of a partition.
	Groups [][]string
	// At is when the fault starts; End when it ends (partition, windowed
	// loss). Windowed is true when the item gave a window or, for skew, a
	// step time.
	At, End  time.Duration
	Windowed bool
	// Loss is the loss probability.
	Loss float64
	// Latency is the latency distribution.
	Latency engine.Latency
	// Skew is the clock offset (skew) or step.
	Skew time.Duration
	// Text is the item as written.
	Text string
}

// ErrFaultSpec is wrapped by every error ParseFaults returns.
var ErrFaultSpec = errors.New("fault spec")

// ParseFaults parses a fault spec (see FaultSyntax). It checks syntax only;
// Config.Validate checks the nodes and the order of events.
func ParseFaults(spec string) ([]Fault, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" || spec == "none" {
		return nil, nil
	}
	var items []string
	for _, tok := range strings.FieldsFunc(spec, func(r rune) bool { return r == ',' || r == ';' }) {
		tok = strings.TrimSpace(tok)
		kind, _, _ := strings.Cut(tok, ":")
		if _, ok := kindNames[kind]; !ok && len(items) > 0 && strings.HasPrefix(items[len(items)-1], "partition:") {
			// "partition:n0|n1,n2@..." continues after the comma.
			items[len(items)-1] += "," + tok
			continue
		}
		items = append(items, tok)
	}
	var out []Fault
	for i, it := range items {
		f, err := parseFault(it)
		if err != nil {
			return nil, fmt.Errorf("%w: item %d %q: %v", ErrFaultSpec, i+1, it, err)
		}
		out = append(out, f)
	}
	return out, nil
}

func parseFault(it string) (Fault, error) {
	kindName, rest, ok := strings.Cut(it, ":")
	if !ok {
		return Fault{}, fmt.Errorf("want KIND:..., one of %s", strings.Join(sortedKinds(), ", "))
	}
	kind, ok := kindNames[kindName]
	if !ok {
		return Fault{}, fmt.Errorf("unknown kind %q, want one of %s", kindName, strings.Join(sortedKinds(), ", "))
	}
	f := Fault{Kind: kind, Text: it}
	switch kind {
	case FaultCrash, FaultRestart, FaultLeave, FaultJoin:
		node, at, ok := strings.Cut(rest, "@")
		if !ok {
			return f, fmt.Errorf(`missing "@TIME"`)
		}
		if err := checkNode(node); err != nil {
			return f, err
		}
		t, err := parseTime(at)
		if err != nil {
			return f, err
		}
		f.Node, f.At = node, t
	case FaultPartition:
		groups, win, ok := strings.Cut(rest, "@")
		if !ok {
			return f, fmt.Errorf(`missing "@T1-T2"`)
		}
		seen := map[string]bool{}
		for g := range strings.SplitSeq(groups, "|") {
			var group []string
			for n := range strings.SplitSeq(g, ",") {
				n = strings.TrimSpace(n)
				if err := checkNode(n); err != nil {
					return f, err
				}
				if seen[n] {
					return f, fmt.Errorf("node %q in two groups", n)
				}
				seen[n] = true
				group = append(group, n)
			}
			f.Groups = append(f.Groups, group)
		}
		a, b, err := parseWindow(win)
		if err != nil {
			return f, err
		}
		f.At, f.End, f.Windowed = a, b, true
	case FaultLoss:
		p, win, hasWin := strings.Cut(rest, "@")
		v, err := strconv.ParseFloat(p, 64)
		if err != nil || v < 0 || v > 1 {
			return f, fmt.Errorf("loss %q: want a probability in [0, 1]", p)
		}
		f.Loss = v
		if hasWin {
			a, b, err := parseWindow(win)
			if err != nil {
				return f, err
			}
			f.At, f.End, f.Windowed = a, b, true
		}
	case FaultLatency:
		l, err := ParseLatency(rest)
		if err != nil {
			return f, err
		}
		f.Latency = l
	case FaultSkew:
		node, rest, ok := strings.Cut(rest, ":")
		if !ok {
			return f, fmt.Errorf(`want skew:NODE:±D[@T]`)
		}
		if err := checkNode(node); err != nil {
			return f, err
		}
		d, at, hasAt := strings.Cut(rest, "@")
		if len(d) == 0 || (d[0] != '+' && d[0] != '-') {
			return f, fmt.Errorf("skew %q: want a signed duration such as +50ms or -2s", d)
		}
		v, err := time.ParseDuration(d)
		if err != nil {
			return f, fmt.Errorf("skew %q: %v", d, err)
		}
		f.Node, f.Skew = node, v
		if hasAt {
			t, err := parseTime(at)
			if err != nil {
				return f, err
			}
			f.At, f.Windowed = t, true
		}
	}
	return f, nil
}

// ParseLatency parses a latency distribution: const:D, uniform:D1:D2 or
// lognormal:MEDIAN:SIGMA.
func ParseLatency(s string) (engine.Latency, error) {
	parts := strings.Split(s, ":")
	dur := func(x string) (time.Duration, error) {
		d, err := time.ParseDuration(x)
		if err != nil {
			return 0, fmt.Errorf("latency %q: %v", x, err)
		}
		if d < 0 {
			return 0, fmt.Errorf("latency %q: negative", x)
		}
		return d, nil
	}
	switch parts[0] {
	case "const":
		if len(parts) != 2 {
			return nil, fmt.Errorf("latency %q: want const:D", s)
		}
		d, err := dur(parts[1])
		if err != nil {
			return nil, err
		}
		return engine.Const{D: d}, nil
	case "uniform":
		if len(parts) != 3 {
			return nil, fmt.Errorf("latency %q: want uniform:D1:D2", s)
		}
		a, err := dur(parts[1])
		if err != nil {
			return nil, err
		}
		b, err := dur(parts[2])
		if err != nil {
			return nil, err
		}
		if b < a {
			return nil, fmt.Errorf("latency %q: upper bound below lower bound", s)
		}
		return engine.Uniform{Lo: a, Hi: b}, nil
	case "lognormal":
		if len(parts) != 3 {
			return nil, fmt.Errorf("latency %q: want lognormal:MEDIAN:SIGMA", s)
		}
		m, err := dur(parts[1])
		if err != nil {
			return nil, err
		}
		sig, err := strconv.ParseFloat(parts[2], 64)
		if err != nil || sig < 0 || sig > 5 {
			return nil, fmt.Errorf("latency %q: sigma %q: want a number in [0, 5]", s, parts[2])
		}
		return engine.LogNormal{Median: m, Sigma: sig}, nil
	}
	return nil, fmt.Errorf("latency %q: want const:D, uniform:D1:D2 or lognormal:MEDIAN:SIGMA", s)
}

func checkNode(n string) error {
	num, ok := strings.CutPrefix(n, "n")
	if !ok || num == "" {
		return fmt.Errorf("node %q: want n0, n1, ...", n)
	}
	v, err := strconv.Atoi(num)
	if err != nil || v < 0 || strconv.Itoa(v) != num {
		return fmt.Errorf("node %q: want n0, n1, ...", n)
	}
	return nil
}

func nodeIndex(n string) int {
	v, _ := strconv.Atoi(strings.TrimPrefix(n, "n"))
	return v
}

func parseTime(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("time %q: %v", s, err)
	}
	if d < 0 {
		return 0, fmt.Errorf("time %q: negative", s)
	}
	return d, nil
}

func parseWindow(s string) (time.Duration, time.Duration, error) {
	a, b, ok := strings.Cut(s, "-")
	if !ok {
		return 0, 0, fmt.Errorf("window %q: want T1-T2", s)
	}
	ta, err := parseTime(a)
	if err != nil {
		return 0, 0, err
	}
	tb, err := parseTime(b)
	if err != nil {
		return 0, 0, err
	}
	if tb <= ta {
		return 0, 0, fmt.Errorf("window %q: ends before it starts", s)
	}
	return ta, tb, nil
}

// FormatFaults writes faults back as a spec that ParseFaults reads.
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

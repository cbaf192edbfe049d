package envoyoracle

import (
	"fmt"
	"math/rand"
	"os"
	"strings"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"gopkg.in/yaml.v3"
)

// descNode is a descriptor of a config file, as far as the generator needs
// it (the rest of the file is read by the two services, not by the test).
type descNode struct {
	Key            string     `yaml:"key"`
	Value          string     `yaml:"value"`
	ShareThreshold bool       `yaml:"share_threshold"`
	Descriptors    []descNode `yaml:"descriptors"`
}

type domainFile struct {
	Domain      string     `yaml:"domain"`
	Descriptors []descNode `yaml:"descriptors"`
}

func loadDomains(files []string) ([]domainFile, error) {
	var out []domainFile
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var d domainFile
		if err := yaml.Unmarshal(b, &d); err != nil {
			return nil, fmt.Errorf("%s: %v", f, err)
		}
		out = append(out, d)
	}
	return out, nil
}

// generator makes random requests from the descriptors of the config files:
// values drawn from small pools so that counters reach their limits, values
// matching trailing wildcards, literal and expanded values with a `*`
// inside, values that match nothing, extra entries past the last level,
// hits_addend 0, 1 and several (per request and per descriptor), the
// `limit` override Envoy sends, and several descriptors per request.
type generator struct {
	rng     *rand.Rand
	domains []domainFile
}

var valuePool = []string{"a", "b", "c"}

func (g *generator) value(n descNode) string {
	r := g.rng.Float64()
	switch {
	case n.Value == "":
		if r < 0.05 {
			return "" // an empty value: the key alone
		}
		return valuePool[g.rng.Intn(len(valuePool))]
	case r < 0.08:
		return "zz-" + valuePool[g.rng.Intn(len(valuePool))] // matches no value of the level
	case strings.HasSuffix(n.Value, "*") && !strings.Contains(strings.TrimSuffix(n.Value, "*"), "*"):
		suffixes := []string{"", "x", "y1", "/deep/er"}
		return strings.TrimSuffix(n.Value, "*") + suffixes[g.rng.Intn(len(suffixes))]
	case strings.Contains(n.Value, "*"):
		if r < 0.5 {
			return n.Value // the literal value, star included
		}
		return strings.ReplaceAll(n.Value, "*", valuePool[g.rng.Intn(len(valuePool))]) // what a mid-value wildcard would match
	default:
		return n.Value
	}
}

// descriptor walks one random path of the domain's descriptor tree.
func (g *generator) descriptor(d domainFile) *commonv3.RateLimitDescriptor {
	desc := &commonv3.RateLimitDescriptor{}
	level := d.Descriptors
	for len(level) > 0 {
		n := level[g.rng.Intn(len(level))]
		desc.Entries = append(desc.Entries, &commonv3.RateLimitDescriptor_Entry{Key: n.Key, Value: g.value(n)})
		if len(n.Descriptors) == 0 || g.rng.Float64() < 0.3 {
			break
		}
		level = n.Descriptors
	}
	if g.rng.Float64() < 0.04 {
		desc.Entries = append(desc.Entries, &commonv3.RateLimitDescriptor_Entry{Key: "extra", Value: "e"})
	}
	if g.rng.Float64() < 0.02 {
		units := []typev3.RateLimitUnit{typev3.RateLimitUnit_SECOND, typev3.RateLimitUnit_MINUTE}
		desc.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: uint32(1 + g.rng.Intn(4)), Unit: units[g.rng.Intn(len(units))]}
	}
	if g.rng.Float64() < 0.1 {
		desc.HitsAddend = wrapperspb.UInt64(uint64(g.rng.Intn(4)))
	}
	return desc
}

// hits is a request's hits_addend: 0 (read as 1 by both), 1, or several.
func (g *generator) hits() uint32 {
	r := g.rng.Float64()
	switch {
	case r < 0.1:
		return 0
	case r < 0.7:
		return 1
	case r < 0.93:
		return uint32(2 + g.rng.Intn(4))
	default:
		return uint32(10 + g.rng.Intn(30))
	}
}

// step is one request, or two for check-then-charge: the same descriptors
// with hits_addend 0 on each (a look), then 1 (the charge), as Envoy's
// apply_on_stream_done does.
func (g *generator) step() []*pb.RateLimitRequest {
	d := g.domains[g.rng.Intn(len(g.domains))]
	n := 1 + g.rng.Intn(3)
	req := &pb.RateLimitRequest{Domain: d.Domain, HitsAddend: g.hits()}
	for range n {
		req.Descriptors = append(req.Descriptors, g.descriptor(d))
	}
	if g.rng.Float64() < 0.15 {
		look := &pb.RateLimitRequest{Domain: d.Domain}
		charge := &pb.RateLimitRequest{Domain: d.Domain}
		for _, desc := range req.Descriptors {
			l := &commonv3.RateLimitDescriptor{Entries: desc.Entries, HitsAddend: wrapperspb.UInt64(0)}
			c := &commonv3.RateLimitDescriptor{Entries: desc.Entries, HitsAddend: wrapperspb.UInt64(1)}
			look.Descriptors = append(look.Descriptors, l)
			charge.Descriptors = append(charge.Descriptors, c)
		}
		return []*pb.RateLimitRequest{look, charge}
	}
	return []*pb.RateLimitRequest{req}
}

// sharePatterns lists, per domain and key, the wildcard values with
// share_threshold: every value they match is one counter in
// envoyproxy/ratelimit.
func sharePatterns(domains []domainFile) map[string][]string {
	out := map[string][]string{}
	var walk func(domain string, level []descNode)
	walk = func(domain string, level []descNode) {
		for _, n := range level {
			if n.ShareThreshold && strings.HasSuffix(n.Value, "*") {
				k := domain + "|" + n.Key
				out[k] = append(out[k], n.Value)
			}
			walk(domain, n.Descriptors)
		}
	}
	for _, d := range domains {
		walk(d.Domain, d.Descriptors)
	}
	return out
}

package weir_test

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"pgregory.net/rapid"

	"github.com/weir-dev/weir/quota"
)

// modelGen draws the model test's rules and requests.
type modelGen struct {
	cfg                         modelConfig
	ips, apiKeys, xUsers, users []string
	paths                       []string
}

// The override identities are only ever sent as header values, so that
// which namespace an override matches never matters to the model.
var modelOverrideIDs = []string{"key-gold", "key-free"}

func newModelGen(cfg modelConfig) *modelGen {
	g := &modelGen{cfg: cfg,
		paths: []string{"/search", "/search/x", "/searchx", "/login", "/v1/users/7/orders", "/v1/users/7/orders/x", "/api/a", "/"}}
	if cfg.overlap {
		// The same text from several sources: 198.51.100.7 is an IP, an
		// API key, an X-User value and a user.
		g.ips = []string{"198.51.100.7", "203.0.113.9", "2001:db8::1", ""}
		g.apiKeys = []string{"198.51.100.7", "key-gold", "alice", ""}
		g.xUsers = []string{"198.51.100.7", "key-free", "alice", ""}
		g.users = []string{"alice", "198.51.100.7", ""}
	} else {
		g.ips = []string{"192.0.2.1", "192.0.2.2", "2001:db8::1", ""}
		g.apiKeys = []string{"key-gold", "key-free", "key-3", ""}
		g.xUsers = []string{"key-gold", "hu-2", ""}
		g.users = []string{"u-1", "u-2", ""}
	}
	return g
}

var (
	modelChains = [][]quota.KeySource{
		{{Kind: quota.KeyHeader, Name: "X-Api-Key"}, {Kind: quota.KeyIP}},
		{{Kind: quota.KeyHeader, Name: "X-User"}, {Kind: quota.KeyIP}},
		{{Kind: quota.KeyUser}, {Kind: quota.KeyIP}},
		{{Kind: quota.KeyIP}},
		{{Kind: quota.KeyHeader, Name: "X-Api-Key"}},
		{{Kind: quota.KeyUser}},
		{{Kind: quota.KeyGlobal}},
		{{Kind: quota.KeyHeader, Name: "X-Api-Key"}, {Kind: quota.KeyUser}, {Kind: quota.KeyIP}},
	}
	modelMatches = []quota.Match{
		{},
		{Prefix: "/search"},
		{Path: "/login", Methods: []string{"POST"}},
		{Pattern: "/v1/users/{id}/orders"},
		{Pattern: "/v1/users/{id}/*"},
		{Prefix: "/", Methods: []string{"GET"}},
	}
	modelAlgs = []quota.Algorithm{quota.AlgorithmGCRA, quota.AlgorithmGCRA, quota.AlgorithmGCRA, quota.AlgorithmFixedWindow,
		quota.AlgorithmSlidingWindow, quota.AlgorithmSlidingLog, quota.AlgorithmLeakyBucket, quota.AlgorithmConcurrency}
	modelWindows = []time.Duration{time.Second, 10 * time.Second, time.Minute, 15 * time.Minute}
)

// maxCost is the largest cost a rule charges (cost and cost_by_method).
func maxCost(r *quota.Rule) int64 {
	c := max(r.Cost, 1)
	for _, v := range r.CostByMethod {
		c = max(c, v)
	}
	return c
}

// fix makes r valid: every limit and burst at least the largest cost,
// burst only where the algorithm has one.
func fix(r *quota.Rule) {
	c := maxCost(r)
	r.Limit = max(r.Limit, c)
	if r.Burst != 0 {
		r.Burst = max(r.Burst, c)
	}
	if r.Algorithm != quota.AlgorithmGCRA && r.Algorithm != quota.AlgorithmLeakyBucket {
		r.Burst = 0
	}
	if r.Algorithm != quota.AlgorithmLeakyBucket {
		r.MaxDelay = 0
	}
	for i := range r.Overrides {
		o := &r.Overrides[i]
		if o.Limit != 0 {
			o.Limit = max(o.Limit, c)
		}
		if o.Burst != 0 {
			o.Burst = max(o.Burst, c)
		}
	}
	for i := range r.Tiers {
		t := &r.Tiers[i]
		t.Limit = max(t.Limit, c)
		if t.Burst != 0 {
			t.Burst = max(t.Burst, c)
		}
	}
}

func (g *modelGen) rule(t *rapid.T, id string) quota.Rule {
	r := quota.Rule{
		ID:        id,
		Match:     rapid.SampledFrom(modelMatches).Draw(t, id+".match"),
		Key:       rapid.SampledFrom(modelChains).Draw(t, id+".key"),
		Algorithm: rapid.SampledFrom(modelAlgs).Draw(t, id+".algorithm"),
		Limit:     rapid.Int64Range(1, 8).Draw(t, id+".limit"),
		Window:    rapid.SampledFrom(modelWindows).Draw(t, id+".window"),
	}
	if g.cfg.rotate && !g.cfg.setRules && !g.cfg.file {
		// Under key-cap pressure alone every rule has the rate of the
		// issue's login rule, 5 per 15 minutes, so that what the rotating
		// identities owe is one rate's worth in every store (a gcra
		// store compares debts in time: see refLimiter).
		r.Limit, r.Window = 5, 15*time.Minute
	}
	if rapid.Bool().Draw(t, id+".burst?") {
		r.Burst = rapid.Int64Range(1, 8).Draw(t, id+".burst")
	}
	if rapid.IntRange(0, 3).Draw(t, id+".cost?") == 3 {
		r.Cost = 2
	}
	if rapid.IntRange(0, 3).Draw(t, id+".costByMethod?") == 3 {
		r.CostByMethod = map[string]int64{"POST": 2}
	}
	if r.Algorithm == quota.AlgorithmLeakyBucket && rapid.Bool().Draw(t, id+".maxDelay?") {
		r.MaxDelay = rapid.SampledFrom([]time.Duration{time.Second, 5 * time.Second, time.Minute}).Draw(t, id+".maxDelay")
	}
	r.Shadow = rapid.IntRange(0, 5).Draw(t, id+".shadow") == 5
	if rapid.IntRange(0, 2).Draw(t, id+".override?") == 2 {
		r.Overrides = []quota.Override{g.override(t, id, 0)}
	}
	if rapid.IntRange(0, 2).Draw(t, id+".tier?") == 2 {
		r.Tiers = []quota.Tier{{Name: "gold", Limit: rapid.Int64Range(1, 12).Draw(t, id+".tier.limit")}}
	}
	if rapid.IntRange(0, 2).Draw(t, id+".penalty?") == 2 {
		r.Penalty = g.penalty(t, id)
	}
	fix(&r)
	return r
}

func (g *modelGen) override(t *rapid.T, id string, i int) quota.Override {
	o := quota.Override{Identity: modelOverrideIDs[i]}
	if rapid.Bool().Draw(t, id+".override.limit?") {
		o.Limit = rapid.Int64Range(1, 12).Draw(t, id+".override.limit")
	}
	if o.Limit == 0 || rapid.Bool().Draw(t, id+".override.burst?") {
		o.Burst = rapid.Int64Range(1, 12).Draw(t, id+".override.burst")
	}
	return o
}

func (g *modelGen) penalty(t *rapid.T, id string) *quota.Penalty {
	base := rapid.SampledFrom([]time.Duration{time.Second, 5 * time.Second, 30 * time.Second}).Draw(t, id+".penalty.base")
	return &quota.Penalty{
		After:  rapid.Int64Range(1, 3).Draw(t, id+".penalty.after"),
		Within: rapid.SampledFrom([]time.Duration{10 * time.Second, time.Minute}).Draw(t, id+".penalty.within"),
		Base:   base,
		Max:    base * time.Duration(rapid.SampledFrom([]int64{1, 4}).Draw(t, id+".penalty.max")),
	}
}

// ruleSet draws one to three rules.
func (g *modelGen) ruleSet(t *rapid.T) []quota.Rule {
	k := rapid.IntRange(1, 3).Draw(t, "rules")
	var rs []quota.Rule
	for i := range k {
		rs = append(rs, g.rule(t, fmt.Sprintf("r%d", i)))
	}
	return rs
}

// cloneRule copies r deeply enough for mutate.
func cloneRule(r quota.Rule) quota.Rule {
	r.Key = slices.Clone(r.Key)
	r.Overrides = slices.Clone(r.Overrides)
	r.Tiers = slices.Clone(r.Tiers)
	if r.CostByMethod != nil {
		m := map[string]int64{}
		for k, v := range r.CostByMethod {
			m[k] = v
		}
		r.CostByMethod = m
	}
	if r.Penalty != nil {
		p := *r.Penalty
		r.Penalty = &p
	}
	return r
}

// mutate returns rules with one to three changes. A rule whose
// concurrency slots are held keeps its algorithm.
func (g *modelGen) mutate(t *rapid.T, rules []quota.Rule, held map[string]bool) []quota.Rule {
	out := make([]quota.Rule, len(rules))
	for i := range rules {
		out[i] = cloneRule(rules[i])
	}
	k := rapid.IntRange(1, 3).Draw(t, "changes")
	for range k {
		what := rapid.SampledFrom([]string{"limit", "limit", "burst", "burst", "window", "algorithm", "cost", "match",
			"override", "tier", "shadow", "penalty", "add", "remove", "maxDelay"}).Draw(t, "change")
		if what == "add" || len(out) == 0 {
			ids := []string{"r0", "r1", "r2", "r3"}
			// Not one removed by this change: re-added in the same change it
			// would be the same rule changed in everything, its key too.
			has := func(rs []quota.Rule, id string) bool {
				return slices.ContainsFunc(rs, func(r quota.Rule) bool { return r.ID == id })
			}
			ids = slices.DeleteFunc(ids, func(id string) bool { return has(out, id) || has(rules, id) })
			if len(ids) > 0 {
				out = append(out, g.rule(t, rapid.SampledFrom(ids).Draw(t, "add")))
			}
			continue
		}
		i := rapid.IntRange(0, len(out)-1).Draw(t, "rule")
		r := &out[i]
		switch what {
		case "limit":
			r.Limit = rapid.Int64Range(1, 60).Draw(t, "limit")
		case "burst":
			if rapid.IntRange(0, 3).Draw(t, "burst.default") == 0 {
				r.Burst = 0
			} else {
				r.Burst = rapid.Int64Range(1, 60).Draw(t, "burst")
			}
		case "window":
			if r.Algorithm != quota.AlgorithmSlidingWindow {
				r.Window = rapid.SampledFrom(modelWindows).Draw(t, "window")
			}
		case "algorithm":
			a := rapid.SampledFrom(modelAlgs).Draw(t, "algorithm")
			if held[r.ID] && (a == quota.AlgorithmConcurrency) != (r.Algorithm == quota.AlgorithmConcurrency) {
				continue
			}
			r.Algorithm = a
		case "cost":
			r.Cost = rapid.Int64Range(0, 2).Draw(t, "cost")
			if rapid.Bool().Draw(t, "costByMethod") {
				r.CostByMethod = map[string]int64{"POST": 2}
			} else {
				r.CostByMethod = nil
			}
		case "match":
			r.Match = rapid.SampledFrom(modelMatches).Draw(t, "match")
		case "override":
			switch {
			case len(r.Overrides) > 0 && rapid.Bool().Draw(t, "override.remove"):
				r.Overrides = r.Overrides[:len(r.Overrides)-1]
			case len(r.Overrides) > 0 && rapid.Bool().Draw(t, "override.change"):
				r.Overrides[0] = g.override(t, r.ID, 0)
			case len(r.Overrides) < 2:
				r.Overrides = append(r.Overrides, g.override(t, r.ID, len(r.Overrides)))
			}
		case "tier":
			if len(r.Tiers) > 0 && rapid.Bool().Draw(t, "tier.remove") {
				r.Tiers = nil
			} else {
				tr := quota.Tier{Name: "gold", Limit: rapid.Int64Range(1, 60).Draw(t, "tier.limit")}
				if rapid.Bool().Draw(t, "tier.burst?") {
					tr.Burst = rapid.Int64Range(1, 60).Draw(t, "tier.burst")
				}
				r.Tiers = []quota.Tier{tr}
			}
		case "shadow":
			r.Shadow = !r.Shadow
		case "penalty":
			if r.Penalty != nil && rapid.Bool().Draw(t, "penalty.remove") {
				r.Penalty = nil
			} else {
				r.Penalty = g.penalty(t, r.ID)
			}
		case "remove":
			out = slices.Delete(out, i, i+1)
			continue
		case "maxDelay":
			r.MaxDelay = rapid.SampledFrom([]time.Duration{0, time.Second, 5 * time.Second, time.Minute}).Draw(t, "maxDelay")
		}
		if r.Algorithm == quota.AlgorithmSlidingLog {
			r.Limit = min(r.Limit, quota.MaxSlidingLogLimit)
		}
		fix(r)
	}
	return out
}

// request draws one request; through the middleware it has no cost of its
// own.
func (g *modelGen) request(t *rapid.T, viaHTTP bool) modelReq {
	paths := g.paths
	if viaHTTP {
		paths = append(slices.Clone(paths), "/a/../search", "//search", "/api/./login")
	}
	q := modelReq{
		method:  rapid.SampledFrom([]string{"GET", "GET", "POST"}).Draw(t, "method"),
		path:    rapid.SampledFrom(paths).Draw(t, "path"),
		apiKey:  rapid.SampledFrom(g.apiKeys).Draw(t, "X-Api-Key"),
		xUser:   rapid.SampledFrom(g.xUsers).Draw(t, "X-User"),
		user:    rapid.SampledFrom(g.users).Draw(t, "user"),
		ip:      rapid.SampledFrom(g.ips).Draw(t, "ip"),
		viaHTTP: viaHTTP,
	}
	if g.cfg.setRules || g.cfg.file {
		// An identity moving tier is a change of its limits: drawn only
		// where rule changes are.
		q.tier = rapid.SampledFrom([]string{"", "", "gold", "silver"}).Draw(t, "tier")
	}
	if !viaHTTP {
		if rapid.IntRange(0, 5).Draw(t, "lower") == 5 {
			q.method = "post"
		}
		q.cost = rapid.SampledFrom([]int64{0, 0, 0, 1, 2, 9}).Draw(t, "cost")
		q.keepSlots = rapid.Bool().Draw(t, "hold")
	}
	return q
}

// modelRulesYAML writes rules as a rules file.
func modelRulesYAML(rules []quota.Rule) string {
	var b strings.Builder
	if len(rules) == 0 {
		return "rules: []\n"
	}
	b.WriteString("rules:\n")
	for _, r := range rules {
		fmt.Fprintf(&b, "  - id: %s\n", r.ID)
		m := r.Match
		if m.Path != "" || m.Prefix != "" || m.Pattern != "" || len(m.Methods) > 0 {
			var parts []string
			if m.Path != "" {
				parts = append(parts, "path: "+m.Path)
			}
			if m.Prefix != "" {
				parts = append(parts, "prefix: "+m.Prefix)
			}
			if m.Pattern != "" {
				parts = append(parts, fmt.Sprintf("pattern: %q", m.Pattern))
			}
			if len(m.Methods) > 0 {
				parts = append(parts, "methods: ["+strings.Join(m.Methods, ", ")+"]")
			}
			fmt.Fprintf(&b, "    match: {%s}\n", strings.Join(parts, ", "))
		}
		var keys []string
		for _, k := range r.Key {
			keys = append(keys, k.String())
		}
		if len(keys) > 0 {
			fmt.Fprintf(&b, "    key: [%s]\n", strings.Join(keys, ", "))
		}
		fmt.Fprintf(&b, "    limit: %d\n    window: %v\n", r.Limit, r.Window)
		if r.Burst != 0 {
			fmt.Fprintf(&b, "    burst: %d\n", r.Burst)
		}
		if r.Cost != 0 {
			fmt.Fprintf(&b, "    cost: %d\n", r.Cost)
		}
		if c, ok := r.CostByMethod["POST"]; ok {
			fmt.Fprintf(&b, "    cost_by_method: {POST: %d}\n", c)
		}
		if r.Algorithm != "" {
			fmt.Fprintf(&b, "    algorithm: %s\n", r.Algorithm)
		}
		if r.MaxDelay != 0 {
			fmt.Fprintf(&b, "    max_delay: %v\n", r.MaxDelay)
		}
		if r.Shadow {
			b.WriteString("    shadow: true\n")
		}
		for i, o := range r.Overrides {
			if i == 0 {
				b.WriteString("    overrides:\n")
			}
			fmt.Fprintf(&b, "      - {identity: %s", o.Identity)
			if o.Limit != 0 {
				fmt.Fprintf(&b, ", limit: %d", o.Limit)
			}
			if o.Burst != 0 {
				fmt.Fprintf(&b, ", burst: %d", o.Burst)
			}
			b.WriteString("}\n")
		}
		for i, t := range r.Tiers {
			if i == 0 {
				b.WriteString("    tiers:\n")
			}
			fmt.Fprintf(&b, "      - {name: %s, limit: %d", t.Name, t.Limit)
			if t.Burst != 0 {
				fmt.Fprintf(&b, ", burst: %d", t.Burst)
			}
			b.WriteString("}\n")
		}
		if p := r.Penalty; p != nil {
			fmt.Fprintf(&b, "    penalty: {after: %d, within: %v, base: %v, max: %v}\n", p.After, p.Within, p.Base, p.Max)
		}
	}
	return b.String()
}

// describeRules is a one-line summary of rules for the failure log.
func describeRules(rules []quota.Rule) string {
	var parts []string
	for _, r := range rules {
		s := fmt.Sprintf("%s{%s %d/%v", r.ID, r.Algorithm, r.Limit, r.Window)
		if r.Burst != 0 {
			s += fmt.Sprintf(" burst %d", r.Burst)
		}
		if r.Cost != 0 {
			s += fmt.Sprintf(" cost %d", r.Cost)
		}
		if len(r.CostByMethod) > 0 {
			s += fmt.Sprintf(" cost_by_method %v", r.CostByMethod)
		}
		if r.MaxDelay != 0 {
			s += fmt.Sprintf(" max_delay %v", r.MaxDelay)
		}
		var keys []string
		for _, k := range r.Key {
			keys = append(keys, k.String())
		}
		s += fmt.Sprintf(" key [%s] match %+v", strings.Join(keys, ","), r.Match)
		if r.Shadow {
			s += " shadow"
		}
		if len(r.Overrides) > 0 {
			s += fmt.Sprintf(" overrides %+v", r.Overrides)
		}
		if len(r.Tiers) > 0 {
			s += fmt.Sprintf(" tiers %+v", r.Tiers)
		}
		if r.Penalty != nil {
			s += fmt.Sprintf(" penalty %+v", *r.Penalty)
		}
		parts = append(parts, s+"}")
	}
	return "[" + strings.Join(parts, " ") + "]"
}

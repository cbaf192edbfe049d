package envoyconf

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir/quota"
)

func load(t *testing.T, opts Options) *Config {
	t.Helper()
	d, err := LoadFile("testdata/ratelimit.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := Compile(opts, d)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestRealisticConfig loads a file that uses every field and checks the
// rules made from it and the matches of descriptors against it.
func TestRealisticConfig(t *testing.T) {
	c := load(t, Options{})
	byID := map[string]quota.Rule{}
	for _, r := range c.Rules() {
		byID[r.ID] = r
	}
	want := map[string]struct {
		limit  int64
		window time.Duration
		shadow bool
	}{
		"envoy.edge.remote_address":        {50, time.Second, false},
		"envoy.edge.api_key":               {1000, time.Hour, false},
		"envoy.edge.api_key.path__search-": {20, time.Minute, false}, // prefix; hashed id
		"envoy.edge.path":                  {100, time.Minute, false},
		"envoy.edge.tenant_trial-_-":       {10, 24 * time.Hour, false},
		"envoy.edge.tenant_batch-_-":       {5000, 7 * 24 * time.Hour, false},
		"envoy.edge.export":                {3, 30 * 24 * time.Hour, true},
		"envoy.edge.plan_free.user":        {100000, 365 * 24 * time.Hour, false},
	}
	if len(byID) != len(want) {
		t.Fatalf("got %d rules, want %d: %v", len(byID), len(want), c.Rules())
	}
	for prefix, w := range want {
		var found *quota.Rule
		for id, r := range byID {
			if id == prefix || (strings.HasSuffix(prefix, "-") && strings.HasPrefix(id, prefix)) {
				found = &r
				break
			}
		}
		if found == nil {
			t.Errorf("no rule %s in %v", prefix, byID)
			continue
		}
		if found.Limit != w.limit || found.Burst != w.limit || found.Window != w.window || found.Shadow != w.shadow ||
			found.Mode != quota.ModeShared || found.Algorithm != quota.AlgorithmGCRA {
			t.Errorf("%s: %+v, want limit=burst=%d window=%v shadow=%v gcra shared", found.ID, *found, w.limit, w.window, w.shadow)
		}
	}
	if _, err := quota.NewSet(c.Rules(), 1); err != nil {
		t.Fatalf("imported rules do not make a set: %v", err)
	}

	e := func(kv ...string) []Entry {
		var es []Entry
		for i := 0; i < len(kv); i += 2 {
			es = append(es, Entry{kv[i], kv[i+1]})
		}
		return es
	}
	cases := []struct {
		name     string
		domain   string
		entries  []Entry
		rule     string // "" with ok: unlimited or blocked; prefix match
		identity string
		ok       bool
		check    func(*Limit) bool
	}{
		{"per ip", "edge", e("remote_address", "10.0.0.1"), "envoy.edge.remote_address", "remote_address=10.0.0.1", true, nil},
		{"other ip, own bucket", "edge", e("remote_address", "10.0.0.2"), "envoy.edge.remote_address", "remote_address=10.0.0.2", true, nil},
		{"blocked", "edge", e("remote_address_blocked", "10.0.0.66"), "", "", true, func(l *Limit) bool { return l.Blocked }},
		{"api key", "edge", e("api_key", "k1"), "envoy.edge.api_key", "api_key=k1", true, func(l *Limit) bool { return l.Name == "per_key" }},
		{"partner unlimited", "edge", e("api_key", "partner-1"), "", "", true, func(l *Limit) bool { return l.Unlimited }},
		{"nested search", "edge", e("api_key", "k1", "path", "/search"), "envoy.edge.api_key.path__search-", "api_key=k1/path=%2Fsearch", true,
			func(l *Limit) bool { return len(l.Replaces) == 1 && l.Replaces[0] == "per_path" }},
		{"nested other path: no limit", "edge", e("api_key", "k1", "path", "/other"), "", "", false, nil},
		{"path", "edge", e("path", "/x"), "envoy.edge.path", "path=%2Fx", true, nil},
		{"trial wildcard", "edge", e("tenant", "trial-42"), "envoy.edge.tenant_trial-_-", "tenant=trial-42", true, nil},
		{"batch shares", "edge", e("tenant", "batch-7"), "envoy.edge.tenant_batch-_-", "tenant=batch-*", true, nil},
		{"tenant without a wildcard", "edge", e("tenant", "paid-1"), "", "", false, nil},
		{"shadow export", "edge", e("export", "csv"), "envoy.edge.export", "export=csv", true, func(l *Limit) bool { return l.Shadow }},
		{"group with no limit", "edge", e("plan", "free"), "", "", false, nil},
		{"yearly", "edge", e("plan", "free", "user", "u1"), "envoy.edge.plan_free.user", "plan=free/user=u1", true, nil},
		{"longer than the tree", "edge", e("remote_address", "1", "x", "y"), "", "", false, nil},
		{"unknown domain", "other", e("remote_address", "10.0.0.1"), "", "", false, nil},
		{"escaping keeps paths apart", "edge", e("remote_address", "a/b=c"), "envoy.edge.remote_address", "remote_address=a%2Fb%3Dc", true, nil},
	}
	for _, tc := range cases {
		m, ok := c.Match(tc.domain, tc.entries)
		if ok != tc.ok {
			t.Errorf("%s: ok=%v, want %v", tc.name, ok, tc.ok)
			continue
		}
		if !ok {
			continue
		}
		if !strings.HasPrefix(m.Limit.RuleID, tc.rule) || (tc.rule == "") != (m.Limit.RuleID == "") {
			t.Errorf("%s: rule %q, want %q", tc.name, m.Limit.RuleID, tc.rule)
		}
		if tc.rule != "" && m.Identity != tc.identity {
			t.Errorf("%s: identity %q, want %q", tc.name, m.Identity, tc.identity)
		}
		if tc.check != nil && !tc.check(m.Limit) {
			t.Errorf("%s: limit %+v", tc.name, *m.Limit)
		}
	}

	// replaces: per_key_search replaces per_path when both match.
	a, _ := c.Match("edge", e("api_key", "k1", "path", "/search"))
	b, _ := c.Match("edge", e("path", "/search"))
	k, _ := c.Match("edge", e("api_key", "k1"))
	got := Replaced([]*Limit{a.Limit, b.Limit, nil, k.Limit})
	if got[0] || !got[1] || got[2] || got[3] {
		t.Errorf("Replaced = %v, want only the per_path limit", got)
	}
}

func TestOptions(t *testing.T) {
	for _, r := range load(t, Options{Mode: quota.ModeExact, Accuracy: 0.1}).Rules() {
		if r.Algorithm != quota.AlgorithmGCRA || r.Mode != quota.ModeExact || r.Accuracy != 0.1 {
			t.Errorf("%s: %s/%s/%v, want gcra/exact/0.1", r.ID, r.Algorithm, r.Mode, r.Accuracy)
		}
	}
	c := load(t, Options{FixedWindow: true, OnFailure: quota.OnFailureOpen})
	for _, r := range c.Rules() {
		if r.Algorithm != quota.AlgorithmFixedWindow || r.Mode != quota.ModeExact || r.OnFailure != quota.OnFailureOpen {
			t.Errorf("%s: %s/%s/%s, want fixed_window/exact/open", r.ID, r.Algorithm, r.Mode, r.OnFailure)
		}
	}
	if _, err := quota.NewSet(c.Rules(), 1); err != nil {
		t.Fatal(err)
	}
}

func TestErrors(t *testing.T) {
	cases := []struct{ name, yaml, want string }{
		{"empty", "", "x.yaml: empty file"},
		{"no domain", "descriptors: []\n", "x.yaml:1: domain: must not be empty"},
		{"unknown field", "domain: d\nfoo: 1\n", "x.yaml:2: foo: unknown field"},
		{"empty key", "domain: d\ndescriptors:\n  - value: v\n", "x.yaml:3: descriptors[0].key: descriptor has an empty key"},
		{"bad unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n",
			`x.yaml:5: descriptors[0].rate_limit.unit: invalid unit "fortnight"`},
		{"missing unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      requests_per_unit: 1\n",
			"x.yaml:4: descriptors[0].rate_limit.unit: missing"},
		{"unit with unlimited", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n      unit: second\n",
			"x.yaml:6: descriptors[0].rate_limit.unit: must not be set when unlimited"},
		{"duplicate", "domain: d\ndescriptors:\n  - key: k\n  - key: k\n", `x.yaml:4: descriptors[1]: duplicate descriptor "k" (first at line 3)`},
		{"bad number", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n",
			"x.yaml:4: descriptors[0].rate_limit.requests_per_unit: expected a whole number"},
		{"replaces self", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, name: a, replaces: [{name: a}]}\n",
			"descriptors[0].rate_limit.replaces[0].name: a limit cannot replace itself"},
		{"empty replaces", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{}]}\n",
			"descriptors[0].rate_limit.replaces[0].name: replaces entries must name a limit"},
		{"share without wildcard", "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n",
			"descriptors[0].share_threshold: only a wildcard value"},
		{"nested error", "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        shadow_mode: yes please\n",
			"x.yaml:6: descriptors[0].descriptors[0].shadow_mode: expected true or false"},
		{"bad yaml", "domain: [\n", "x.yaml:"},
	}
	for _, tc := range cases {
		_, err := Parse("x.yaml", []byte(tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want it to contain %q", tc.name, err, tc.want)
			continue
		}
		var qe *quota.Error
		if !errors.As(err, &qe) || !errors.Is(err, quota.ErrSyntax) {
			t.Errorf("%s: %T is not a quota syntax error", tc.name, err)
		}
	}
	// Two files of one domain.
	d1, _ := Parse("a.yaml", []byte("domain: d\n"))
	d2, _ := Parse("b.yaml", []byte("domain: d\n"))
	if _, err := Compile(Options{}, d1, d2); err == nil || !strings.Contains(err.Error(), `b.yaml: domain: duplicate domain "d" (also in a.yaml)`) {
		t.Errorf("duplicate domain: %v", err)
	}
}

func TestRuleIDs(t *testing.T) {
	long := strings.Repeat("x", 200)
	for _, path := range []string{".a", ".a/b", "." + long, ".ü"} {
		id := ruleID("envoy.", "d", path)
		if len(id) > 128 || strings.ContainsFunc(id, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_.:-", r))
		}) {
			t.Errorf("ruleID(%q) = %q is not a valid rule id", path, id)
		}
	}
	if ruleID("envoy.", "d", ".a/b") == ruleID("envoy.", "d", ".a_b") {
		t.Error("a path with a replaced character shares the id of its look-alike")
	}
}

// TestMergeDomains: with MergeDomains two files of one domain make one
// tree, as envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG; a top-level
// descriptor in both is refused with its file, line and field; without it
// the second file is refused.
func TestMergeDomains(t *testing.T) {
	parse := func(name, text string) *Domain {
		t.Helper()
		d, err := Parse(name, []byte(text))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	a := parse("a.yaml", "domain: m\ndescriptors:\n  - key: k1\n    rate_limit: {unit: minute, requests_per_unit: 1}\n")
	b := parse("b.yaml", "domain: m\ndescriptors:\n  - key: k2\n    rate_limit: {unit: hour, requests_per_unit: 2}\n")
	if _, err := Compile(Options{}, a, b); err == nil || !strings.Contains(err.Error(), "duplicate domain") {
		t.Fatalf("without merging: %v", err)
	}
	cfg, err := Compile(Options{MergeDomains: true}, a, b)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"k1", "k2"} {
		if _, ok := cfg.Match("m", []Entry{{Key: k, Value: "v"}}); !ok {
			t.Errorf("merged: %s does not match", k)
		}
	}
	if len(cfg.Rules()) != 2 {
		t.Errorf("merged: %d rules, want 2", len(cfg.Rules()))
	}
	c := parse("c.yaml", "domain: m\ndescriptors:\n  - key: x\n  - key: k1\n    rate_limit: {unit: second, requests_per_unit: 3}\n")
	if _, err := Compile(Options{MergeDomains: true}, a, c); err == nil || !strings.Contains(err.Error(), `c.yaml:4: descriptors[1]: duplicate descriptor "k1"`) {
		t.Fatalf("a descriptor in both files: %v", err)
	}
}

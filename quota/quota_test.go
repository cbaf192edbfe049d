package quota

import (
	"errors"
	goparser "go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const example = `rules:
  - id: search-per-key
    description: Search, per API key
    match: {prefix: /search, methods: [GET, POST]}
    key: [header:X-API-Key, user, ip]
    limit: 100
    window: 1m          # Go duration
    burst: 20
    cost: 1
    cost_by_method: {POST: 5}
    algorithm: gcra
    mode: shared
    durable: false
    scope: region
    on_failure: local
    accuracy: 0.05
    shadow: false
    overrides: [{identity: key-acme, limit: 1000, burst: 200}]
    tiers: [{name: gold, limit: 1000, burst: 100}]
    penalty: {after: 10, within: 1m, base: 1s, max: 10m}
`

func TestParseExample(t *testing.T) {
	rules, err := Parse("rules.yaml", []byte(example))
	if err != nil {
		t.Fatal(err)
	}
	if len(rules) != 1 {
		t.Fatalf("got %d rules", len(rules))
	}
	r := rules[0]
	if r.ID != "search-per-key" || r.Limit != 100 || r.Window != time.Minute || r.Burst != 20 ||
		r.Match.Prefix != "/search" || len(r.Match.Methods) != 2 || r.CostByMethod["POST"] != 5 ||
		r.Accuracy != 0.05 || r.Penalty == nil || r.Penalty.Max != 10*time.Minute ||
		len(r.Key) != 3 || r.Key[0] != (KeySource{KeyHeader, "X-API-Key"}) || r.Key[2].Kind != KeyIP {
		t.Fatalf("parsed %+v", r)
	}
	s, err := NewSet(rules, 7)
	if err != nil {
		t.Fatal(err)
	}
	n := s.Rule(0)
	if n.Key[0].Name != "X-Api-Key" {
		t.Errorf("header not canonicalised: %q", n.Key[0].Name)
	}
	if got := n.CostFor("POST"); got != 5 {
		t.Errorf("CostFor(POST) = %d", got)
	}
	if got := n.CostFor("post"); got != 5 {
		t.Errorf("CostFor(post) = %d", got)
	}
	if got := n.CostFor("GET"); got != 1 {
		t.Errorf("CostFor(GET) = %d", got)
	}
	for _, c := range []struct {
		id, tier     string
		limit, burst int64
	}{
		{"key-acme", "gold", 1000, 200},
		{"key-other", "gold", 1000, 100},
		{"key-other", "", 100, 20},
		{"key-other", "silver", 100, 20},
	} {
		l, b := n.LimitsFor(c.id, c.tier)
		l2, b2 := s.LimitsFor(0, c.id, c.tier)
		if l != c.limit || b != c.burst || l2 != l || b2 != b {
			t.Errorf("LimitsFor(%q, %q) = %d, %d / %d, %d; want %d, %d", c.id, c.tier, l, b, l2, b2, c.limit, c.burst)
		}
	}
}

// errorsOf flattens a joined error into its *Error parts.
func errorsOf(t *testing.T, err error) []*Error {
	t.Helper()
	if err == nil {
		return nil
	}
	var out []*Error
	var walk func(error)
	walk = func(e error) {
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, x := range j.Unwrap() {
				walk(x)
			}
			return
		}
		var qe *Error
		if !errors.As(e, &qe) {
			t.Fatalf("error %v (%T) is not a *Error", e, e)
		}
		out = append(out, qe)
	}
	walk(err)
	return out
}

func TestParseErrors(t *testing.T) {
	cases := []struct {
		name, yaml string
		want       []string // substrings, one per expected error, in order
		sentinel   error
	}{
		{"empty", "", []string{"rules.yaml: no rules"}, ErrNoRules},
		{"comments only", "# nothing\n", []string{"no rules"}, ErrNoRules},
		{"null", "~\n", []string{"no rules"}, ErrNoRules},
		{"rules null", "rules:\n", []string{"rules.yaml:1: rules: expected a list of rules, got null"}, ErrSyntax},
		{"no rules field", "{}\n", []string{"rules: missing"}, ErrNoRules},
		{"syntax", "rules: [\n", []string{"rules.yaml:"}, ErrSyntax},
		{"two docs", "rules: []\n---\nrules: []\n", []string{"more than one YAML document"}, ErrSyntax},
		{"unknown top", "rules: []\nversion: 2\n", []string{`rules.yaml:2: version: unknown field "version"`}, ErrSyntax},
		{"window zero", "rules:\n- id: a\n  limit: 1\n  window: 0s\n", []string{"rules.yaml:4: rules[0].window: must be positive, got 0s (rule \"a\")"}, ErrInvalidRule},
		{"limit abc", "rules:\n- id: a\n  limit: abc\n  window: 1s\n", []string{`rules.yaml:3: rules[0].limit: expected an integer, got "abc" (rule "a")`}, ErrSyntax},
		{"limit float", "rules:\n- id: a\n  limit: 1.5\n  window: 1s\n", []string{`rules[0].limit: expected an integer, got "1.5"`}, ErrSyntax},
		{"bare window", "rules:\n- id: a\n  limit: 1\n  window: 60\n", []string{`rules.yaml:4: rules[0].window: expected a duration with a unit`}, ErrSyntax},
		{"bad window", "rules:\n- id: a\n  limit: 1\n  window: 1 minute\n", []string{`rules[0].window: expected a duration like "1m" or "500ms", got "1 minute"`}, ErrSyntax},
		{"dup field", "rules:\n- id: a\n  limit: 1\n  limit: 2\n  window: 1s\n", []string{`rules.yaml:4: rules[0].limit: duplicate field "limit" (first at line 3)`}, ErrSyntax},
		{"unknown field", "rules:\n- id: a\n  limit: 1\n  window: 1s\n  brust: 3\n", []string{`rules.yaml:5: rules[0].brust: unknown field "brust"`}, ErrSyntax},
		{"explicit zero burst", "rules:\n- id: a\n  limit: 1\n  window: 1s\n  burst: 0\n", []string{`rules.yaml:5: rules[0].burst: must be positive; omit`}, ErrSyntax},
		{"merge key", "x: &x {limit: 1}\nrules:\n- <<: *x\n  id: a\n", []string{`unknown field "x"`, "merge keys"}, ErrSyntax},
		{"bool", "rules:\n- id: a\n  limit: 1\n  window: 1s\n  shadow: maybe\n", []string{`rules[0].shadow: expected true or false, got "maybe"`}, ErrSyntax},
		{"key mapping", "rules:\n- id: a\n  limit: 1\n  window: 1s\n  key: [header: X-Key]\n", []string{`rules[0].key[0]: expected a string like header:X-API-Key`}, ErrSyntax},
		{"many", `rules:
  - id: a
    limit: 0
    window: 1s
  - id: a
    limit: 10
    window: 1s
    cost: 11
  - id: "bad id!"
    limit: 1
    window: 1s
    algorithm: fixed_window
    mode: shared
    match: {path: /x, prefix: /y}
`, []string{
			"rules.yaml:3: rules[0].limit: must be positive, got 0",
			"rules.yaml:5: rules[1].id: duplicate id, also used by rules[0]",
			"rules.yaml:8: rules[1].cost: 11 is above the burst 10",
			`rules.yaml:9: rules[2].id: "bad id!" must match`,
			"rules.yaml:13: rules[2].mode: shared mode needs algorithm gcra",
			"rules.yaml:14: rules[2].match: set at most one of path, prefix and pattern",
		}, ErrInvalidRule},
		{"syntax and validation", "rules:\n- id: a\n  limit: x\n  window: 1s\n  burst: -1\n", []string{
			`rules.yaml:3: rules[0].limit: expected an integer`,
			`rules.yaml:5: rules[0].burst: must be positive, got -1`,
		}, ErrSyntax},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rules, err := Parse("rules.yaml", []byte(c.yaml))
			if err == nil {
				t.Fatalf("no error; rules %+v", rules)
			}
			if rules != nil {
				t.Errorf("rules returned with an error")
			}
			if !errors.Is(err, c.sentinel) {
				t.Errorf("error %v is not %v", err, c.sentinel)
			}
			es := errorsOf(t, err)
			if len(es) != len(c.want) {
				t.Fatalf("got %d errors, want %d:\n%v", len(es), len(c.want), err)
			}
			for i, w := range c.want {
				if !strings.Contains(es[i].Error(), w) {
					t.Errorf("error %d = %q, want it to contain %q", i, es[i].Error(), w)
				}
			}
		})
	}
}

func TestParseEmptySet(t *testing.T) {
	rules, err := Parse("r.yaml", []byte("rules: []\n"))
	if err != nil || len(rules) != 0 {
		t.Fatalf("rules: [] -> %v, %v", rules, err)
	}
	s, err := NewSet(rules, 1)
	if err != nil || s.Len() != 0 {
		t.Fatal(err)
	}
	if got := s.Match("GET", "/", nil); len(got) != 0 {
		t.Fatalf("empty set matched %v", got)
	}
}

func TestParseAliasesAndScalars(t *testing.T) {
	src := `rules:
  - &base
    id: a
    limit: 10
    window: 1s
    key: ip
    match: {methods: get}
  - id: b
    limit: 10
    window: 1s
    overrides:
    match: ~
`
	rules, err := Parse("r.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if len(rules[0].Key) != 1 || rules[0].Key[0].Kind != KeyIP || rules[0].Match.Methods[0] != "get" {
		t.Fatalf("%+v", rules[0])
	}
	s, err := NewSet(rules, 1)
	if err != nil {
		t.Fatal(err)
	}
	if m := s.Rule(0).Match.Methods; len(m) != 1 || m[0] != "GET" {
		t.Fatalf("methods not normalised: %v", m)
	}
	if k := s.Rule(1).Key; len(k) != 1 || k[0].Kind != KeyGlobal {
		t.Fatalf("empty key not normalised to global: %v", k)
	}
}

func validRule() Rule { return Rule{ID: "r", Limit: 10, Window: time.Second} }

func TestValidate(t *testing.T) {
	cases := []struct {
		name string
		mod  func(*Rule)
		want string // "" = valid
	}{
		{"ok", func(*Rule) {}, ""},
		{"no id", func(r *Rule) { r.ID = "" }, "rules[0].id: required"},
		{"long id", func(r *Rule) { r.ID = strings.Repeat("a", 129) }, "rules[0].id:"},
		{"neg limit", func(r *Rule) { r.Limit = -1 }, "rules[0].limit: must be positive"},
		{"zero window", func(r *Rule) { r.Window = 0 }, "rules[0].window: must be positive"},
		{"neg burst", func(r *Rule) { r.Burst = -2 }, "rules[0].burst: must be positive"},
		{"rate above 1/ns", func(r *Rule) { r.Limit, r.Window = 11, 10 }, "above one per nanosecond"},
		{"rate 1/ns", func(r *Rule) { r.Limit, r.Window = 10, 10 }, ""},
		{"neg cost", func(r *Rule) { r.Cost = -1 }, "rules[0].cost: must be at least 1"},
		{"cost > burst", func(r *Rule) { r.Burst = 3; r.Cost = 4 }, "rules[0].cost: 4 is above the burst 3"},
		{"cost == burst", func(r *Rule) { r.Burst = 3; r.Cost = 3 }, ""},
		{"method cost > burst", func(r *Rule) { r.CostByMethod = map[string]int64{"POST": 11} }, "rules[0].cost_by_method.POST: 11 is above the burst 10"},
		{"method cost zero", func(r *Rule) { r.CostByMethod = map[string]int64{"POST": 0} }, "cost_by_method.POST: must be at least 1"},
		{"method cost dup", func(r *Rule) { r.CostByMethod = map[string]int64{"POST": 1, "post": 2} }, "duplicate method"},
		{"method cost bad", func(r *Rule) { r.CostByMethod = map[string]int64{"PO ST": 1} }, "not a valid HTTP method token"},
		{"algorithm", func(r *Rule) { r.Algorithm = "magic" }, `unknown algorithm "magic"`},
		{"token bucket", func(r *Rule) { r.Algorithm = AlgorithmTokenBucket; r.Mode = ModeShared }, ""},
		{"mode", func(r *Rule) { r.Mode = "x" }, `unknown mode "x"`},
		{"scope", func(r *Rule) { r.Scope = "x" }, `unknown scope "x"`},
		{"on_failure", func(r *Rule) { r.OnFailure = "x" }, `unknown on_failure "x"`},
		{"shared fw", func(r *Rule) { r.Algorithm = AlgorithmFixedWindow; r.Mode = ModeShared }, "shared mode needs algorithm gcra"},
		{"durable sw", func(r *Rule) { r.Algorithm = AlgorithmSlidingWindow; r.Durable = true }, "durable needs algorithm gcra"},
		{"durable local", func(r *Rule) { r.Durable = true; r.Mode = ModeLocal }, "durable contradicts mode local"},
		{"global lb", func(r *Rule) { r.Algorithm = AlgorithmLeakyBucket; r.Scope = ScopeGlobal }, "global scope needs algorithm gcra"},
		{"enforce regions", func(r *Rule) { r.Shadow = true; r.EnforceRegions = []string{"us", "eu"} }, ""},
		{"enforce regions no shadow", func(r *Rule) { r.EnforceRegions = []string{"eu"} }, "rules[0].enforce_regions: only with shadow: true"},
		{"enforce regions dup", func(r *Rule) { r.Shadow = true; r.EnforceRegions = []string{"eu", "eu"} }, `rules[0].enforce_regions[1]: region "eu" appears twice`},
		{"enforce regions bad", func(r *Rule) { r.Shadow = true; r.EnforceRegions = []string{"e u"} }, `rules[0].enforce_regions[0]: region "e u" must match`},
		{"exact fw", func(r *Rule) { r.Algorithm = AlgorithmFixedWindow; r.Mode = ModeExact }, ""},
		{"count rejected fw", func(r *Rule) { r.Algorithm = AlgorithmFixedWindow; r.Mode = ModeExact; r.CountRejected = true }, ""},
		{"count rejected local fw", func(r *Rule) { r.Algorithm = AlgorithmFixedWindow; r.Mode = ModeLocal; r.CountRejected = true }, ""},
		{"count rejected gcra", func(r *Rule) { r.CountRejected = true }, "rules[0].count_rejected: needs algorithm fixed_window, not gcra"},
		{"count rejected sw", func(r *Rule) { r.Algorithm = AlgorithmSlidingWindow; r.CountRejected = true }, "count_rejected: needs algorithm fixed_window, not sliding_window"},
		{"sliding log cap", func(r *Rule) { r.Algorithm = AlgorithmSlidingLog; r.Limit = 10001 }, "above 10000"},
		{"sliding log override cap", func(r *Rule) {
			r.Algorithm = AlgorithmSlidingLog
			r.Overrides = []Override{{Identity: "x", Limit: 20000}}
		}, "rules[0].overrides[0].limit: 20000 is above 10000"},
		{"accuracy", func(r *Rule) { r.Accuracy = 0.6 }, "rules[0].accuracy: must be in (0, 0.5]"},
		{"accuracy neg", func(r *Rule) { r.Accuracy = -0.1 }, "accuracy"},
		{"max delay gcra", func(r *Rule) { r.MaxDelay = time.Second }, "only applies to leaky_bucket"},
		{"max delay neg", func(r *Rule) { r.Algorithm = AlgorithmLeakyBucket; r.MaxDelay = -1 }, "max_delay: must be positive"},
		{"two matchers", func(r *Rule) { r.Match.Path = "/a"; r.Match.Pattern = "/b" }, "at most one"},
		{"path slash", func(r *Rule) { r.Match.Path = "a" }, `rules[0].match.path: "a" must start with "/"`},
		{"prefix slash", func(r *Rule) { r.Match.Prefix = "a" }, `match.prefix`},
		{"pattern slash", func(r *Rule) { r.Match.Pattern = "a/{x}" }, `must start with "/"`},
		{"pattern star mid", func(r *Rule) { r.Match.Pattern = "/a/*/b" }, `"*" may only be the last segment`},
		{"pattern mixed", func(r *Rule) { r.Match.Pattern = "/a{x}" }, `mixes`},
		{"pattern bad name", func(r *Rule) { r.Match.Pattern = "/{1x}" }, `invalid parameter name`},
		{"pattern dup name", func(r *Rule) { r.Match.Pattern = "/{x}/{x}" }, `duplicate parameter {x}`},
		{"pattern ok", func(r *Rule) { r.Match.Pattern = "/v1/{a}/b/{c_2}/*" }, ""},
		{"method", func(r *Rule) { r.Match.Methods = []string{"GET", "BAD METHOD"} }, `rules[0].match.methods[1]: "BAD METHOD"`},
		{"header no name", func(r *Rule) { r.Key = []KeySource{{Kind: KeyHeader}} }, "rules[0].key[0]: header key needs a name"},
		{"header bad name", func(r *Rule) { r.Key = []KeySource{{Kind: KeyHeader, Name: "a b"}} }, "not a valid header name"},
		{"ip with name", func(r *Rule) { r.Key = []KeySource{{Kind: KeyIP, Name: "x"}} }, "ip key takes no name"},
		{"key kind", func(r *Rule) { r.Key = []KeySource{{Kind: "cookie"}} }, `unknown key kind "cookie"`},
		{"global not last", func(r *Rule) { r.Key = []KeySource{{Kind: KeyGlobal}, {Kind: KeyIP}} }, "must be last"},
		{"dup key", func(r *Rule) {
			r.Key = []KeySource{{Kind: KeyHeader, Name: "x-key"}, {Kind: KeyHeader, Name: "X-Key"}}
		}, "rules[0].key[1]: duplicate key source header:X-Key"},
		{"override no identity", func(r *Rule) { r.Overrides = []Override{{Limit: 1}} }, "rules[0].overrides[0].identity: required"},
		{"override dup", func(r *Rule) { r.Overrides = []Override{{Identity: "a", Limit: 1}, {Identity: "a", Limit: 2}} }, "overrides[1].identity: duplicate identity"},
		{"override empty", func(r *Rule) { r.Overrides = []Override{{Identity: "a"}} }, "sets neither limit nor burst"},
		{"override burst < cost", func(r *Rule) { r.Cost = 5; r.Overrides = []Override{{Identity: "a", Burst: 4}} }, "overrides[0].burst: 4 is below the largest cost 5"},
		{"override burst < method cost", func(r *Rule) {
			r.CostByMethod = map[string]int64{"POST": 6}
			r.Overrides = []Override{{Identity: "a", Burst: 5}}
		}, "below the largest cost 6"},
		{"override neg", func(r *Rule) { r.Overrides = []Override{{Identity: "a", Limit: -1}} }, "overrides[0].limit: must be positive"},
		{"tier no limit", func(r *Rule) { r.Tiers = []Tier{{Name: "g"}} }, "rules[0].tiers[0].limit: must be positive"},
		{"tier no name", func(r *Rule) { r.Tiers = []Tier{{Limit: 1}} }, "tiers[0].name: required"},
		{"tier dup", func(r *Rule) { r.Tiers = []Tier{{Name: "g", Limit: 1}, {Name: "g", Limit: 1}} }, "tiers[1].name: duplicate tier"},
		{"tier burst < cost", func(r *Rule) { r.Cost = 2; r.Tiers = []Tier{{Name: "g", Limit: 5, Burst: 1}} }, "below the largest cost"},
		{"penalty", func(r *Rule) { r.Penalty = &Penalty{} }, "penalty.after: must be positive"},
		{"penalty base > max", func(r *Rule) { r.Penalty = &Penalty{After: 1, Base: time.Minute, Max: time.Second} }, "penalty.base: 1m0s is above max 1s"},
		{"penalty ok", func(r *Rule) { r.Penalty = &Penalty{After: 1, Base: time.Second, Max: time.Second} }, ""},
		{"description utf8", func(r *Rule) { r.Description = "\xff" }, "valid UTF-8"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := validRule()
			c.mod(&r)
			err := Validate([]Rule{r})
			if c.want == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				if _, err := NewSet([]Rule{r}, 1); err != nil {
					t.Fatalf("NewSet: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want %q", c.want)
			}
			if !errors.Is(err, ErrInvalidRule) {
				t.Errorf("not ErrInvalidRule: %v", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q does not contain %q", err, c.want)
			}
			if _, err := NewSet([]Rule{r}, 1); err == nil {
				t.Fatal("NewSet accepted an invalid rule")
			}
		})
	}
}

func TestNormalizeDefaults(t *testing.T) {
	in := []Rule{
		{ID: "g", Limit: 100, Window: time.Minute},
		{ID: "lb", Limit: 10, Window: time.Second, Burst: 5, Algorithm: AlgorithmLeakyBucket},
		{ID: "tb", Limit: 10, Window: time.Second, Algorithm: AlgorithmTokenBucket, Match: Match{Prefix: "/a/"},
			Penalty: &Penalty{After: 1, Base: 1, Max: 2}},
	}
	s, err := NewSet(in, 3)
	if err != nil {
		t.Fatal(err)
	}
	g := s.Rule(0)
	if g.Burst != 100 || g.Cost != 1 || g.Algorithm != AlgorithmGCRA || g.Mode != ModeShared || g.Scope != ScopeRegion ||
		g.OnFailure != OnFailureLocal || g.Accuracy != DefaultAccuracy {
		t.Errorf("gcra defaults: %+v", g)
	}
	lb := s.Rule(1)
	if lb.Mode != ModeLocal || lb.MaxDelay != 0 || lb.QueueDelay(lb.Limit, lb.Burst) != 400*time.Millisecond ||
		lb.QueueDelay(20, 5) != 200*time.Millisecond {
		t.Errorf("leaky defaults: mode %s max delay %s, queue delay %s", lb.Mode, lb.MaxDelay, lb.QueueDelay(lb.Limit, lb.Burst))
	}
	tb := s.Rule(2)
	if tb.Algorithm != AlgorithmGCRA || tb.Match.Prefix != "/a" || tb.Penalty.Within != time.Minute {
		t.Errorf("tb: %+v", tb)
	}
	if in[0].Burst != 0 || in[2].Penalty.Within != 0 {
		t.Error("NewSet modified its input")
	}
	// Deep copy both ways.
	in[2].Penalty.After = 99
	if s.Rule(2).Penalty.After != 1 {
		t.Error("set shares the input's Penalty")
	}
	out := s.Rules()
	out[2].Penalty.After = 42
	out[0].Key[0].Kind = KeyIP
	if s.Rule(2).Penalty.After != 1 || s.Rule(0).Key[0].Kind != KeyGlobal {
		t.Error("Rules() shares the set's memory")
	}
	if i, ok := s.Lookup("lb"); !ok || i != 1 {
		t.Errorf("Lookup(lb) = %d, %v", i, ok)
	}
	if _, ok := s.Lookup("nope"); ok {
		t.Error("Lookup(nope) found")
	}
	if s.Version() != 3 {
		t.Errorf("version %d", s.Version())
	}
	// Normalisation is idempotent and defaults do not change the digest.
	s2, err := NewSet(s.Rules(), 4)
	if err != nil || s2.Digest() != s.Digest() {
		t.Fatalf("digest changed on renormalisation: %v", err)
	}
	if got := defaultMaxDelay(1<<62, 1, time.Hour); got != time.Duration(1<<63-1) {
		t.Errorf("max delay did not saturate: %d", got)
	}
}

func TestDigestDistinguishes(t *testing.T) {
	a, _ := NewSet([]Rule{validRule()}, 1)
	r := validRule()
	r.Limit = 11
	b, _ := NewSet([]Rule{r}, 1)
	c, _ := NewSet([]Rule{validRule()}, 2)
	if a.Digest() == b.Digest() || a.Digest() != c.Digest() || len(a.Digest()) != 64 {
		t.Fatalf("digests: %s %s %s", a.Digest(), b.Digest(), c.Digest())
	}
	r = validRule()
	r.CostByMethod = map[string]int64{"post": 2, "GET": 1}
	d1, _ := NewSet([]Rule{r}, 1)
	r.CostByMethod = map[string]int64{"GET": 1, "POST": 2}
	d2, _ := NewSet([]Rule{r}, 1)
	if d1.Digest() != d2.Digest() {
		t.Fatal("digest depends on method case or map order")
	}
	// enforce_regions: order does not matter, content does.
	r = validRule()
	r.Shadow = true
	shadow, _ := NewSet([]Rule{r}, 1)
	r.EnforceRegions = []string{"us", "eu"}
	e1, _ := NewSet([]Rule{r}, 1)
	r.EnforceRegions = []string{"eu", "us"}
	e2, _ := NewSet([]Rule{r}, 1)
	if e1.Digest() != e2.Digest() || e1.Digest() == shadow.Digest() {
		t.Fatalf("enforce_regions digests: %s %s (shadow only %s)", e1.Digest(), e2.Digest(), shadow.Digest())
	}
}

func TestHolder(t *testing.T) {
	var h Holder
	if h.Current() != nil {
		t.Fatal("zero Holder has a set")
	}
	s1, err := h.Apply([]Rule{validRule()})
	if err != nil || s1.Version() != 1 || h.Current() != s1 {
		t.Fatalf("first apply: %v %v", s1, err)
	}
	same, err := h.Apply([]Rule{validRule()})
	if err != nil || same != s1 {
		t.Fatalf("unchanged apply swapped: %v", err)
	}
	r := validRule()
	r.Limit = 20
	s2, err := h.Apply([]Rule{r})
	if err != nil || s2.Version() != 2 || h.Current() != s2 {
		t.Fatalf("changed apply: %v", err)
	}
	bad := validRule()
	bad.Window = 0
	kept, err := h.Apply([]Rule{bad})
	if err == nil || kept != s2 || h.Current() != s2 {
		t.Fatalf("bad apply: %v", err)
	}
}

func TestLoadOrDefault(t *testing.T) {
	dir := t.TempDir()
	defaults := []Rule{{ID: "default", Limit: 1000, Window: time.Second}}
	s, err := LoadOrDefault(filepath.Join(dir, "missing.yaml"), defaults)
	if err == nil || s == nil || s.Rule(0).ID != "default" || !strings.Contains(err.Error(), "enforcing 1 default rules") {
		t.Fatalf("missing file: %v %v", s, err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("rules:\n- id: x\n  limit: 1\n  window: nope\n"), 0o644)
	s, err = LoadOrDefault(bad, defaults)
	if err == nil || s == nil || !strings.Contains(err.Error(), "bad.yaml:4: rules[0].window") {
		t.Fatalf("bad file: %v %v", s, err)
	}
	good := filepath.Join(dir, "good.yaml")
	os.WriteFile(good, []byte(example), 0o644)
	s, err = LoadOrDefault(good, defaults)
	if err != nil || s.Rule(0).ID != "search-per-key" || s.Version() != 1 {
		t.Fatalf("good file: %v", err)
	}
	s, err = LoadOrDefault(bad, []Rule{{ID: "bad"}})
	if s != nil || err == nil {
		t.Fatal("invalid defaults accepted")
	}
}

// TestDocsExample parses every yaml block of docs/rules.md, so the docs
// cannot drift from the parser.
func TestDocsExample(t *testing.T) {
	data, err := os.ReadFile("../docs/rules.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllSubmatch(data, -1)
	if len(blocks) == 0 {
		t.Fatal("no yaml block in docs/rules.md")
	}
	for i, b := range blocks {
		rules, err := Parse("rules.md#"+strconv.Itoa(i), b[1])
		if err != nil {
			t.Fatalf("docs yaml block %d: %v", i, err)
		}
		if _, err := NewSet(rules, 1); err != nil {
			t.Fatalf("docs yaml block %d: %v", i, err)
		}
	}
}

// TestImports enforces docs/design.md's layout: quota reaches only the standard library,
// yaml and fsnotify (tests also rapid and goleak), nothing of weir's but
// internal/yamlwalk, the strict YAML walk it shares with envoyconf (itself
// only the standard library and yaml).
func TestImports(t *testing.T) {
	allowed := map[string]bool{
		"go.yaml.in/yaml/v3": true, "github.com/fsnotify/fsnotify": true,
		"github.com/weir-dev/weir/internal/yamlwalk": true,
		"pgregory.net/rapid":                         true, "go.uber.org/goleak": true,
		"github.com/weir-dev/weir/quota": true, // the external example test
	}
	files, _ := filepath.Glob("*.go")
	fset := token.NewFileSet()
	for _, f := range files {
		af, err := goparser.ParseFile(fset, f, nil, goparser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range af.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			first, _, _ := strings.Cut(p, "/")
			if strings.Contains(first, ".") && !allowed[p] {
				t.Errorf("%s imports %s", f, p)
			}
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			if p == "pgregory.net/rapid" || p == "go.uber.org/goleak" {
				t.Errorf("%s imports test-only %s", f, p)
			}
		}
	}
}

func TestMarshalRoundTrip(t *testing.T) {
	rules, err := Parse("r.yaml", []byte(example))
	if err != nil {
		t.Fatal(err)
	}
	out, err := Marshal(rules)
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse("r.yaml", out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	a, _ := NewSet(rules, 1)
	b, _ := NewSet(back, 1)
	if a.Digest() != b.Digest() {
		t.Fatalf("round trip changed the rules:\n%s", out)
	}
	if _, err := Marshal([]Rule{{ID: "x"}}); err == nil {
		t.Fatal("Marshal accepted an invalid rule")
	}
}

func TestMarshalQuoting(t *testing.T) {
	rules := []Rule{{ID: "123", Description: "a: b # c\x01\u2028 \"q\"\n", Limit: 1, Window: 1500 * time.Millisecond,
		Match: Match{Pattern: "/{a}/*"}, Key: []KeySource{{Kind: KeyHeader, Name: "x-true"}},
		Overrides: []Override{{Identity: "null", Burst: 1}, {Identity: "yes", Limit: 3}}}}
	out, err := Marshal(rules)
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse("r.yaml", out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	a, _ := NewSet(rules, 1)
	b, _ := NewSet(back, 1)
	if a.Digest() != b.Digest() {
		t.Fatalf("round trip changed the rules:\n%s\n%+v", out, back)
	}
}

// TestEnforceRegionsRoundTrip: enforce_regions parses, marshals (sorted)
// and parses back to the same rule.
func TestEnforceRegionsRoundTrip(t *testing.T) {
	in := "rules:\n- id: a\n  limit: 1\n  window: 1s\n  shadow: true\n  enforce_regions: [us-east, eu-west]\n"
	rules, err := Parse("r.yaml", []byte(in))
	if err != nil {
		t.Fatal(err)
	}
	out, err := Marshal(rules)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "enforce_regions: [eu-west, us-east]") {
		t.Fatalf("marshalled:\n%s", out)
	}
	back, err := Parse("r.yaml", out)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := NewSet(rules, 1)
	b, _ := NewSet(back, 1)
	if a.Digest() != b.Digest() {
		t.Fatalf("round trip changed the rule:\n%s", out)
	}
}

// TestCountRejectedRoundTrip: count_rejected parses, marshals and parses
// back; it changes the digest, and a rule without it keeps its digest
// (omitted from the canonical form when false).
func TestCountRejectedRoundTrip(t *testing.T) {
	in := "rules:\n- id: a\n  limit: 1\n  window: 1s\n  algorithm: fixed_window\n  mode: exact\n  count_rejected: true\n"
	rules, err := Parse("r.yaml", []byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if !rules[0].CountRejected {
		t.Fatalf("count_rejected not parsed: %+v", rules[0])
	}
	out, err := Marshal(rules)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "count_rejected: true") {
		t.Fatalf("marshalled:\n%s", out)
	}
	back, err := Parse("r.yaml", out)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := NewSet(rules, 1)
	b, _ := NewSet(back, 1)
	plain := rules[0]
	plain.CountRejected = false
	c, _ := NewSet([]Rule{plain}, 1)
	if a.Digest() != b.Digest() || a.Digest() == c.Digest() {
		t.Fatalf("digests: parsed %s, round trip %s, without count_rejected %s", a.Digest(), b.Digest(), c.Digest())
	}
	if _, err := Parse("r.yaml", []byte("rules:\n- id: a\n  limit: 1\n  window: 1s\n  count_rejected: true\n")); err == nil ||
		!strings.Contains(err.Error(), "count_rejected: needs algorithm fixed_window") {
		t.Fatalf("count_rejected on gcra: %v", err)
	}
}

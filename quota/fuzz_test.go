package quota

import (
	"errors"
	"os"
	"slices"
	"testing"
	"time"
)

func FuzzParse(f *testing.F) {
	f.Add([]byte(example))
	if docs, err := os.ReadFile("../docs/rules.md"); err == nil {
		f.Add(docs)
	}
	for _, s := range []string{
		"", "rules: []\n", "rules:\n", "~", "[]", "rules: [1]\n", "rules: {}\n",
		"rules:\n- id: a\n  limit: 1\n  window: 1s\n",
		"rules:\n- id: a\n  limit: 9223372036854775807\n  window: 1s\n  burst: 0x10\n",
		"rules:\n- &a {id: a, limit: 1, window: 1s}\n- *a\n",
		"rules:\n- id: a\n  limit: 1\n  window: 1s\n  accuracy: .nan\n",
		"rules:\n- id: a\n  limit: 5\n  window: 1h\n  algorithm: leaky_bucket\n  key: [header:x-a, global]\n",
		"rules:\n- {id: \"a\\x01\", description: \"\\x01\\u2028\", limit: 1, window: 1s, match: {pattern: '/{a}/*'}}\n",
		"rules:\n- id: a\n  limit: 1\n  window: 1s\n  penalty: {after: 1, base: 1s, max: 1s}\n  tiers: [{name: g, limit: 2}]\n",
		"x: &x [*x]\n",
		"rules:\n- id: a\n  limit: 1\n  window: 1s\n  sketch: {threshold: 4, period: 1m, width: 4096, depth: 4}\n",
		"rules:\n- id: a\n  limit: 1\n  window: 1s\n  sketch: {threshold: 1}\n",
		"rules:\n- id: a\n  key: [header:x-k, ip]\n  limit: 1\n  window: 1s\n  overrides: [{identity: x, source: ip, limit: 2}, {identity: x, source: header:X-K, burst: 3}]\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		rules, err := Parse("fuzz.yaml", data)
		if err != nil {
			if rules != nil {
				t.Fatal("rules and an error")
			}
			for _, e := range flatten(err) {
				var qe *Error
				if !errors.As(e, &qe) || qe.Msg == "" || qe.File != "fuzz.yaml" || qe.Err == nil {
					t.Fatalf("malformed error %#v", e)
				}
			}
			return
		}
		s, err := NewSet(rules, 1)
		if err != nil {
			t.Fatalf("Parse accepted rules NewSet refuses: %v", err)
		}
		out, err := Marshal(rules)
		if err != nil {
			t.Fatalf("Marshal: %v", err)
		}
		back, err := Parse("fuzz.yaml", out)
		if err != nil {
			t.Fatalf("re-parse of Marshal output: %v\n%s", err, out)
		}
		s2, err := NewSet(back, 1)
		if err != nil {
			t.Fatal(err)
		}
		if s.Digest() != s2.Digest() {
			t.Fatalf("round trip changed the rules:\n%s", out)
		}
		// Exercise the matcher on what was parsed.
		for i := 0; i < s.Len(); i++ {
			r := s.Rule(i)
			for _, p := range []string{r.Match.Path, r.Match.Prefix, r.Match.Pattern, "/"} {
				got := s.Match("GET", p, nil)
				if want := naiveMatch(s.Rules(), "GET", p); !slices.Equal(got, want) {
					t.Fatalf("Match(%q) = %v, naive %v", p, got, want)
				}
			}
		}
	})
}

func flatten(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, flatten(e)...)
		}
		return out
	}
	return []error{err}
}

// FuzzMatch checks the trie against the naive scan for arbitrary patterns,
// prefixes, paths and methods.
func FuzzMatch(f *testing.F) {
	f.Add("/v1/users/{id}/orders", "/search", "/login", "GET", "/v1/users/42/orders")
	f.Add("/files/*", "/", "/", "post", "/files")
	f.Add("/{a}/{b}/*", "/a/", "/a//b", "PURGE", "/a//b")
	f.Add("/", "/x/y", "/x", "", "")
	f.Add("/a/{b}", "//", "/a/b/", "GET", "/a/b/")
	f.Fuzz(func(t *testing.T, pattern, prefix, path, method, reqPath string) {
		var rules []Rule
		add := func(m Match) {
			r := Rule{ID: "r" + string(rune('a'+len(rules))), Limit: 1, Window: time.Second, Match: m}
			if Validate([]Rule{r}) == nil {
				rules = append(rules, r)
			}
		}
		add(Match{Pattern: pattern})
		add(Match{Prefix: prefix})
		add(Match{Path: path})
		add(Match{Pattern: pattern, Methods: []string{method}})
		add(Match{Methods: []string{method}})
		add(Match{})
		s, err := NewSet(rules, 1)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range []string{method, "GET", "get"} {
			got := s.Match(m, reqPath, nil)
			if want := naiveMatch(rules, m, reqPath); !slices.Equal(got, want) {
				t.Fatalf("Match(%q, %q) = %v, naive %v (rules %+v)", m, reqPath, got, want, rules)
			}
		}
	})
}

package quota

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// naiveMatch is the reference: a linear scan with string operations,
// independent of the trie.
func naiveMatch(rules []Rule, method, path string) []int {
	var out []int
	for i, r := range rules {
		if naiveRule(r, method, path) {
			out = append(out, i)
		}
	}
	return out
}

func naiveRule(r Rule, method, path string) bool {
	if len(r.Match.Methods) > 0 && !slices.ContainsFunc(r.Match.Methods, func(m string) bool { return strings.EqualFold(m, method) }) {
		return false
	}
	m := r.Match
	switch {
	case m.Path != "":
		return path == m.Path
	case m.Prefix != "":
		p := strings.TrimRight(m.Prefix, "/")
		if p == "" {
			return strings.HasPrefix(path, "/")
		}
		return path == p || strings.HasPrefix(path, p+"/")
	case m.Pattern != "":
		if !strings.HasPrefix(path, "/") {
			return false
		}
		ps := strings.Split(m.Pattern[1:], "/")
		xs := strings.Split(path[1:], "/")
		for i, s := range ps {
			if s == "*" && i == len(ps)-1 {
				return true
			}
			if i >= len(xs) {
				return false
			}
			if strings.HasPrefix(s, "{") {
				if xs[i] == "" {
					return false
				}
				continue
			}
			if s != xs[i] {
				return false
			}
		}
		return len(xs) == len(ps)
	}
	return true
}

func TestMatchCases(t *testing.T) {
	rules := []Rule{
		{ID: "all", Limit: 1, Window: time.Second},
		{ID: "search", Limit: 1, Window: time.Second, Match: Match{Prefix: "/search"}},
		{ID: "login", Limit: 1, Window: time.Second, Match: Match{Path: "/login", Methods: []string{"post"}}},
		{ID: "orders", Limit: 1, Window: time.Second, Match: Match{Pattern: "/v1/users/{id}/orders"}},
		{ID: "files", Limit: 1, Window: time.Second, Match: Match{Pattern: "/files/*"}},
		{ID: "root", Limit: 1, Window: time.Second, Match: Match{Prefix: "/"}},
		{ID: "slash", Limit: 1, Window: time.Second, Match: Match{Pattern: "/"}},
		{ID: "users-lit", Limit: 1, Window: time.Second, Match: Match{Pattern: "/v1/users/me/orders", Methods: []string{"PURGE"}}},
		{ID: "search-get", Limit: 1, Window: time.Second, Match: Match{Prefix: "/search/", Methods: []string{"GET"}}},
	}
	s, err := NewSet(rules, 1)
	if err != nil {
		t.Fatal(err)
	}
	ids := func(idx []int) string {
		var out []string
		for _, i := range idx {
			out = append(out, s.Rule(i).ID)
		}
		return strings.Join(out, ",")
	}
	for _, c := range []struct{ method, path, want string }{
		{"GET", "/search", "all,search,root,search-get"},
		{"POST", "/search/x/y", "all,search,root"},
		{"GET", "/searchx", "all,root"},
		{"POST", "/login", "all,login,root"},
		{"post", "/login", "all,login,root"},
		{"GET", "/login", "all,root"},
		{"GET", "/v1/users/42/orders", "all,orders,root"},
		{"PURGE", "/v1/users/me/orders", "all,orders,root,users-lit"},
		{"purge", "/v1/users/me/orders", "all,orders,root,users-lit"},
		{"GET", "/v1/users//orders", "all,root"},
		{"GET", "/v1/users/42/orders/x", "all,root"},
		{"GET", "/files", "all,files,root"},
		{"GET", "/files/a/b", "all,files,root"},
		{"GET", "/", "all,root,slash"},
		{"GET", "", "all"},
		{"GET", "*", "all"},
	} {
		got := ids(s.Match(c.method, c.path, nil))
		if got != c.want {
			t.Errorf("Match(%s %q) = %s, want %s", c.method, c.path, got, c.want)
		}
		if naive := ids(naiveMatch(s.Rules(), c.method, c.path)); naive != c.want {
			t.Errorf("naive(%s %q) = %s, want %s", c.method, c.path, naive, c.want)
		}
	}
	// dst is appended to, not overwritten.
	if got := s.Match("GET", "/login", []int{-1}); !slices.Equal(got, []int{-1, 0, 5}) {
		t.Errorf("append: %v", got)
	}
}

// Generators over a small alphabet so that rules and paths collide often.
var (
	segGen    = rapid.SampledFrom([]string{"a", "b", "c", "v1", "", "x"})
	methodGen = rapid.SampledFrom([]string{"GET", "POST", "get", "PURGE", "DELETE", "HEAD"})
)

func pathGen() *rapid.Generator[string] {
	return rapid.Custom(func(t *rapid.T) string {
		if rapid.IntRange(0, 20).Draw(t, "noslash") == 0 {
			return rapid.SampledFrom([]string{"", "*", "a/b"}).Draw(t, "odd")
		}
		segs := rapid.SliceOfN(segGen, 0, 5).Draw(t, "segs")
		return "/" + strings.Join(segs, "/")
	})
}

func ruleGen(i int) *rapid.Generator[Rule] {
	return rapid.Custom(func(t *rapid.T) Rule {
		r := Rule{ID: fmt.Sprintf("r%d", i), Limit: 1, Window: time.Second}
		switch rapid.IntRange(0, 3).Draw(t, "kind") {
		case 0:
		case 1:
			r.Match.Path = pathGen().Filter(func(s string) bool { return strings.HasPrefix(s, "/") }).Draw(t, "path")
		case 2:
			r.Match.Prefix = pathGen().Filter(func(s string) bool { return strings.HasPrefix(s, "/") }).Draw(t, "prefix")
		case 3:
			n := rapid.IntRange(0, 4).Draw(t, "n")
			var segs []string
			for j := 0; j < n; j++ {
				switch rapid.IntRange(0, 2).Draw(t, "segkind") {
				case 0:
					segs = append(segs, fmt.Sprintf("{p%d}", j))
				default:
					segs = append(segs, segGen.Draw(t, "lit"))
				}
			}
			if rapid.Bool().Draw(t, "star") {
				segs = append(segs, "*")
			}
			r.Match.Pattern = "/" + strings.Join(segs, "/")
		}
		if rapid.Bool().Draw(t, "hasMethods") {
			r.Match.Methods = rapid.SliceOfN(methodGen, 1, 3).Draw(t, "methods")
		}
		return r
	})
}

// TestMatchProperty: Match equals a naive linear scan over random rules and
// paths.
func TestMatchProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(0, 30).Draw(t, "rules")
		rules := make([]Rule, n)
		for i := range rules {
			rules[i] = ruleGen(i).Draw(t, "rule")
		}
		s, err := NewSet(rules, 1)
		if err != nil {
			t.Fatalf("generated invalid rules: %v", err)
		}
		for k := 0; k < 20; k++ {
			method := methodGen.Draw(t, "method")
			path := pathGen().Draw(t, "reqpath")
			got := s.Match(method, path, nil)
			want := naiveMatch(rules, method, path)
			if !slices.Equal(got, want) {
				t.Fatalf("Match(%s %q) = %v, naive %v", method, path, got, want)
			}
		}
	})
}

// benchRules builds n rules: 40% exact paths, 30% prefixes, 25% patterns
// with parameters, a handful of catch-alls with method filters.
func benchRules(n int) []Rule {
	rules := make([]Rule, 0, n)
	for i := 0; i < n; i++ {
		r := Rule{ID: fmt.Sprintf("r%d", i), Limit: 100, Window: time.Minute}
		switch {
		case i%100 == 99:
			r.Match.Methods = []string{"POST"}
		case i%20 < 8:
			r.Match.Path = fmt.Sprintf("/api/v%d/svc%d/op", i%3, i)
		case i%20 < 14:
			r.Match.Prefix = fmt.Sprintf("/svc%d", i)
		default:
			r.Match.Pattern = fmt.Sprintf("/v1/svc%d/{id}/items/*", i)
		}
		rules = append(rules, r)
	}
	return rules
}

func benchPaths(n int) []string {
	var paths []string
	for i := 0; i < 64; i++ {
		j := (i * 7919) % n
		switch i % 4 {
		case 0:
			paths = append(paths, fmt.Sprintf("/api/v%d/svc%d/op", j%3, j))
		case 1:
			paths = append(paths, fmt.Sprintf("/svc%d/search/q", j))
		case 2:
			paths = append(paths, fmt.Sprintf("/v1/svc%d/12345/items/9/x", j))
		default:
			paths = append(paths, "/not/a/rule/path")
		}
	}
	return paths
}

func TestMatchNoAlloc(t *testing.T) {
	s, err := NewSet(benchRules(1000), 1)
	if err != nil {
		t.Fatal(err)
	}
	paths := benchPaths(1000)
	dst := make([]int, 0, 64)
	allocs := testing.AllocsPerRun(100, func() {
		for _, p := range paths {
			dst = s.Match("GET", p, dst[:0])
			dst = s.Match("post", p, dst[:0])
		}
	})
	if allocs != 0 {
		t.Fatalf("Match allocates: %v per run", allocs)
	}
}

func BenchmarkMatch(b *testing.B) {
	for _, n := range []int{10, 1000, 10000} {
		rules := benchRules(n)
		s, err := NewSet(rules, 1)
		if err != nil {
			b.Fatal(err)
		}
		paths := benchPaths(n)
		b.Run(fmt.Sprintf("rules=%d", n), func(b *testing.B) {
			dst := make([]int, 0, 256)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				dst = s.Match("GET", paths[i%len(paths)], dst[:0])
				i++
			}
		})
		// POST also matches the 1% method-filtered catch-all rules: the
		// result has n/100 more entries to append and sort.
		b.Run(fmt.Sprintf("rules=%d/POST", n), func(b *testing.B) {
			dst := make([]int, 0, 256)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				dst = s.Match("POST", paths[i%len(paths)], dst[:0])
				i++
			}
		})
		// The reference, in the same run, so the ratio can be read off.
		b.Run(fmt.Sprintf("rules=%d/naive", n), func(b *testing.B) {
			normal := s.Rules()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				_ = naiveMatch(normal, "GET", paths[i%len(paths)])
				i++
			}
		})
	}
}

func BenchmarkNewSet(b *testing.B) {
	rules := benchRules(10000)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := NewSet(rules, 1); err != nil {
			b.Fatal(err)
		}
	}
}

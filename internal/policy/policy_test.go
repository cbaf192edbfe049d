package policy

import (
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// reference is the policy written the plain way, with the stores as
// callbacks: look(i) and take(i) answer whether rule i admits. It returns
// the steps in order and whether the request is admitted.
func reference(rules []Rule, look, take func(i int) bool) ([]Step, bool) {
	var steps []Step
	allowed := true
	enforced := 0
	for _, r := range rules {
		if !r.Shadow {
			enforced++
		}
	}
	shadows := func() {
		for i, r := range rules {
			if !r.Shadow {
				continue
			}
			if allowed {
				steps = append(steps, Step{Take, i})
				take(i)
			} else {
				steps = append(steps, Step{Report, i})
			}
		}
	}
	if enforced > 1 {
		for i, r := range rules {
			if r.Shadow || r.Kind != Local {
				continue
			}
			steps = append(steps, Step{Look, i})
			if !look(i) {
				allowed = false
				for j, q := range rules {
					switch {
					case q.Shadow:
					case j == i:
						steps = append(steps, Step{ReportLook, j})
					default:
						steps = append(steps, Step{Report, j})
					}
				}
				shadows()
				return steps, false
			}
		}
	}
	var admitted []int
	for _, kind := range []Kind{Cluster, Durable} {
		for i, r := range rules {
			if r.Shadow || r.Kind != kind {
				continue
			}
			if !allowed {
				steps = append(steps, Step{Report, i})
				continue
			}
			steps = append(steps, Step{Take, i})
			if take(i) {
				if kind == Cluster {
					admitted = append(admitted, i)
				}
				continue
			}
			allowed = false
			for _, j := range admitted {
				steps = append(steps, Step{Refund, j})
			}
		}
	}
	for i, r := range rules {
		if r.Shadow || r.Kind != Local {
			continue
		}
		if !allowed {
			steps = append(steps, Step{Report, i})
			continue
		}
		steps = append(steps, Step{Take, i})
		if !take(i) {
			allowed = false
		}
	}
	shadows()
	return steps, allowed
}

// run drives a Request over rules, answering looks and takes as the
// callbacks do, and returns its steps and outcome.
func run(rules []Rule, look, take func(i int) bool) ([]Step, bool) {
	var r Request
	r.Start(rules)
	var steps []Step
	for range 10 * (len(rules) + 1) {
		s := r.Next(rules)
		if s.Action == Done {
			return steps, r.Allowed()
		}
		steps = append(steps, s)
		switch s.Action {
		case Look:
			r.Result(look(s.I))
		case Take:
			r.Result(take(s.I))
		}
	}
	panic("the request never ended")
}

// TestRequestMatchesReference: for any rules (kinds, shadows) and any
// answers of the stores, the machine takes the reference's steps in the
// reference's order and decides the request as it does.
func TestRequestMatchesReference(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(0, 7).Draw(t, "rules")
		rules := make([]Rule, n)
		for i := range rules {
			rules[i] = Rule{Kind: Kind(rapid.IntRange(0, 2).Draw(t, "kind")), Shadow: rapid.IntRange(0, 3).Draw(t, "shadow") == 0}
		}
		looks := rapid.SliceOfN(rapid.Bool(), n, n).Draw(t, "looks")
		takes := rapid.SliceOfN(rapid.Bool(), n, n).Draw(t, "takes")
		look := func(i int) bool { return looks[i] }
		take := func(i int) bool { return takes[i] }
		want, wantOK := reference(rules, look, take)
		got, gotOK := run(rules, look, take)
		if !slices.Equal(got, want) || gotOK != wantOK {
			t.Fatalf("rules %v, looks %v, takes %v:\n got %v %v\nwant %v %v", rules, looks, takes, got, gotOK, want, wantOK)
		}
		if Single(rules) && (!slices.Equal(got, []Step{{Take, 0}}) || gotOK != takes[0]) {
			t.Fatalf("Single(%v), but the steps are %v", rules, got)
		}
	})
}

// TestRequestExamples spells out the policy on requests a reader can check.
func TestRequestExamples(t *testing.T) {
	yes := func(int) bool { return true }
	for _, c := range []struct {
		name  string
		rules []Rule
		look  func(int) bool
		take  func(int) bool
		want  string
		ok    bool
	}{
		{"one local rule: no look", []Rule{{Kind: Local}}, yes, yes, "[{Take 0}]", true},
		{"two local rules, the second rejects on look: nothing charged",
			[]Rule{{Kind: Local}, {Kind: Local}}, func(i int) bool { return i == 0 }, yes,
			"[{Look 0} {Look 1} {Report 0} {ReportLook 1}]", false},
		{"a cluster rule rejects: the cluster rule before it is given back, the local one reported",
			[]Rule{{Kind: Cluster}, {Kind: Local}, {Kind: Cluster}}, yes, func(i int) bool { return i != 2 },
			"[{Look 1} {Take 0} {Take 2} {Refund 0} {Report 1}]", false},
		{"a durable rule rejects: every cluster rule is given back",
			[]Rule{{Kind: Durable}, {Kind: Cluster}}, yes, func(i int) bool { return i != 0 },
			"[{Take 1} {Take 0} {Refund 1}]", false},
		{"a shadow rule is charged once the request is admitted, and changes nothing",
			[]Rule{{Kind: Local, Shadow: true}, {Kind: Local}}, yes, func(i int) bool { return i != 0 },
			"[{Take 1} {Take 0}]", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ok := run(c.rules, c.look, c.take)
			if s := fmt.Sprint(got); s != c.want || ok != c.ok {
				t.Fatalf("steps %s, admitted %v; want %s, %v", s, ok, c.want, c.ok)
			}
		})
	}
}

// BenchmarkRequest measures the machine on the common requests (one local
// rule; a local and a cluster rule) against the plain reference with
// callbacks, in one run: the machine's cost per request is what every
// decision of a Node pays for the policy.
func BenchmarkRequest(b *testing.B) {
	yes := func(int) bool { return true }
	for _, c := range []struct {
		name  string
		rules []Rule
	}{
		{"one-local", []Rule{{Kind: Local}}},
		{"local+cluster", []Rule{{Kind: Local}, {Kind: Cluster}}},
	} {
		b.Run(c.name+"/machine", func(b *testing.B) {
			n := 0
			for b.Loop() {
				var r Request
				r.Start(c.rules)
				for s := r.Next(c.rules); s.Action != Done; s = r.Next(c.rules) {
					if s.Action == Look || s.Action == Take {
						r.Result(true)
					}
					n++
				}
			}
			if n == 0 {
				b.Fatal("no step")
			}
		})
		b.Run(c.name+"/reference", func(b *testing.B) {
			for b.Loop() {
				reference(c.rules, yes, yes)
			}
		})
	}
}

package quota

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestSketchParse reads a sketch block, fills its defaults in NewSet, and
// round-trips it through Marshal.
func TestSketchParse(t *testing.T) {
	const src = `rules:
  - id: a
    limit: 100
    window: 1m
    sketch: {threshold: 4, period: 2m, width: 4096, depth: 3}
  - id: b
    limit: 100
    window: 1m
    sketch: {threshold: 2}
  - id: c
    limit: 100
    window: 1m
    sketch: ~
`
	rules, err := Parse("r.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := *rules[0].Sketch, (Sketch{Threshold: 4, Period: 2 * time.Minute, Width: 4096, Depth: 3}); got != want {
		t.Errorf("parsed %+v, want %+v", got, want)
	}
	if got, want := *rules[1].Sketch, (Sketch{Threshold: 2}); got != want {
		t.Errorf("parsed %+v, want %+v (zero fields until NewSet)", got, want)
	}
	if rules[2].Sketch != nil {
		t.Errorf("sketch: ~ parsed as %+v", rules[2].Sketch)
	}
	s, err := NewSet(rules, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := *s.Rule(1).Sketch, (Sketch{Threshold: 2, Period: time.Minute, Width: DefaultSketchWidth, Depth: DefaultSketchDepth}); got != want {
		t.Errorf("normalised %+v, want %+v", got, want)
	}
	if rules[1].Sketch.Period != 0 {
		t.Error("NewSet modified its input's sketch")
	}
	out := s.Rules()
	out[0].Sketch.Threshold = 99
	if s.Rule(0).Sketch.Threshold != 4 {
		t.Error("Rules() shares the set's sketch")
	}
	y, err := Marshal(rules)
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse("r.yaml", y)
	if err != nil {
		t.Fatalf("%v\n%s", err, y)
	}
	s2, err := NewSet(back, 1)
	if err != nil {
		t.Fatal(err)
	}
	if s.Digest() != s2.Digest() {
		t.Fatalf("round trip changed the rules:\n%s", y)
	}
	if !strings.Contains(string(y), "sketch: {threshold: 2, period: 1m0s, width: 65536, depth: 4}") {
		t.Errorf("marshalled sketch not in normalised form:\n%s", y)
	}
}

// TestSketchDigest: the sketch is part of a rule's identity, and a rule
// without one keeps the canonical form (and digest) it had before sketches
// existed.
func TestSketchDigest(t *testing.T) {
	r := validRule()
	a, _ := NewSet([]Rule{r}, 1)
	r.Sketch = &Sketch{Threshold: 4}
	b, _ := NewSet([]Rule{r}, 1)
	r.Sketch = &Sketch{Threshold: 5}
	c, _ := NewSet([]Rule{r}, 1)
	r.Sketch = &Sketch{Threshold: 4, Period: time.Second, Width: DefaultSketchWidth, Depth: DefaultSketchDepth}
	d, _ := NewSet([]Rule{r}, 1)
	if a.Digest() == b.Digest() || b.Digest() == c.Digest() || b.Digest() != d.Digest() {
		t.Fatalf("digests: none %s, 4 %s, 5 %s, 4 spelled out %s", a.Digest(), b.Digest(), c.Digest(), d.Digest())
	}
	canon, err := json.Marshal(a.Rules())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(canon), "Sketch") {
		t.Fatalf("a rule without a sketch names it in its canonical form: %s", canon)
	}
}

func TestSketchValidate(t *testing.T) {
	cases := []struct {
		name string
		mod  func(*Rule)
		want string // "" = valid
	}{
		{"ok", func(r *Rule) { r.Sketch = &Sketch{Threshold: 4} }, ""},
		{"ok full", func(r *Rule) {
			r.Mode = ModeShared
			r.Sketch = &Sketch{Threshold: MaxSketchThreshold, Period: time.Hour, Width: MaxSketchWidth, Depth: MaxSketchDepth}
		}, ""},
		{"token bucket", func(r *Rule) { r.Algorithm = AlgorithmTokenBucket; r.Sketch = &Sketch{Threshold: 1} }, ""},
		{"no threshold", func(r *Rule) { r.Sketch = &Sketch{} }, "rules[0].sketch.threshold: must be at least 1, got 0"},
		{"big threshold", func(r *Rule) { r.Sketch = &Sketch{Threshold: 256} }, "rules[0].sketch.threshold: 256 is above 255"},
		{"exact", func(r *Rule) { r.Mode = ModeExact; r.Sketch = &Sketch{Threshold: 1} }, "rules[0].sketch: needs mode shared, not exact"},
		{"local", func(r *Rule) { r.Mode = ModeLocal; r.Sketch = &Sketch{Threshold: 1} }, "rules[0].sketch: needs mode shared, not local"},
		{"fixed window", func(r *Rule) { r.Algorithm = AlgorithmFixedWindow; r.Sketch = &Sketch{Threshold: 1} }, "rules[0].sketch: needs algorithm gcra and mode shared, not fixed_window"},
		{"durable", func(r *Rule) { r.Durable = true; r.Sketch = &Sketch{Threshold: 1} }, "rules[0].sketch: contradicts durable"},
		{"short period", func(r *Rule) { r.Sketch = &Sketch{Threshold: 1, Period: time.Millisecond} }, "rules[0].sketch.period: 1ms is shorter than the window 1s"},
		{"neg period", func(r *Rule) { r.Sketch = &Sketch{Threshold: 1, Period: -1} }, "rules[0].sketch.period: must be positive"},
		{"wide", func(r *Rule) { r.Sketch = &Sketch{Threshold: 1, Width: MaxSketchWidth + 1} }, "rules[0].sketch.width: must be in [1, 16777216]"},
		{"deep", func(r *Rule) { r.Sketch = &Sketch{Threshold: 1, Depth: 9} }, "rules[0].sketch.depth: must be in [1, 8]"},
		{"neg depth", func(r *Rule) { r.Sketch = &Sketch{Threshold: 1, Depth: -1} }, "rules[0].sketch.depth"},
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
				return
			}
			if err == nil || !errors.Is(err, ErrInvalidRule) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want ErrInvalidRule containing %q", err, c.want)
			}
		})
	}
}

func TestSketchParseErrors(t *testing.T) {
	cases := []struct {
		name, yaml string
		want       []string
	}{
		{"unknown field", "rules:\n- id: a\n  limit: 1\n  window: 1s\n  sketch: {threshold: 1, size: 3}\n",
			[]string{`r.yaml:5: rules[0].sketch.size: unknown field "size" (want one of threshold, period, width, depth) (rule "a")`}},
		{"zero period", "rules:\n- id: a\n  limit: 1\n  window: 1s\n  sketch: {threshold: 1, period: 0s}\n",
			[]string{`r.yaml:5: rules[0].sketch.period: must be positive; omit the field for the default`}},
		{"zero width", "rules:\n- id: a\n  limit: 1\n  window: 1s\n  sketch:\n    threshold: 1\n    width: 0\n",
			[]string{`r.yaml:7: rules[0].sketch.width: must be positive; omit the field for the default`}},
		{"not a mapping", "rules:\n- id: a\n  limit: 1\n  window: 1s\n  sketch: 4\n",
			[]string{`r.yaml:5: rules[0].sketch: expected a mapping, got "4"`}},
		{"exact", "rules:\n- id: a\n  limit: 1\n  window: 1s\n  mode: exact\n  sketch:\n    threshold: 0\n",
			[]string{`r.yaml:6: rules[0].sketch: needs mode shared, not exact`, `r.yaml:7: rules[0].sketch.threshold: must be at least 1, got 0`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("r.yaml", []byte(c.yaml))
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

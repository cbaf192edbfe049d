package quota

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestOverrideSource covers an override's source: which identities it
// matches, its validation and its YAML form.
func TestOverrideSource(t *testing.T) {
	rules, err := Parse("rules.yaml", []byte(`rules:
  - id: api
    key: [header:X-Api-Key, user, ip]
    limit: 10
    window: 1m
    overrides:
      - {identity: abc, limit: 100}
      - {identity: abc, source: user, limit: 200}
      - {identity: 198.51.100.7, source: ip, burst: 30}
      - {identity: def, source: header:x-api-key, limit: 300}
`))
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewSet(rules, 1)
	if err != nil {
		t.Fatal(err)
	}
	hdr, user, ip := KeySource{Kind: KeyHeader, Name: "X-Api-Key"}, KeySource{Kind: KeyUser}, KeySource{Kind: KeyIP}
	for _, c := range []struct {
		src          KeySource
		id           string
		limit, burst int64
	}{
		{KeySource{}, "abc", 100, 10}, // the zero source is the first one
		{hdr, "abc", 100, 10},
		{KeySource{Kind: KeyHeader, Name: "x-api-key"}, "abc", 100, 10},
		{user, "abc", 200, 10},
		{ip, "abc", 10, 10}, // no override for the ip "abc"
		{ip, "198.51.100.7", 10, 30},
		{hdr, "198.51.100.7", 10, 10}, // an API key equal to that IP is not that IP
		{KeySource{}, "def", 300, 10}, // an explicit first source is the default
		{user, "def", 10, 10},
	} {
		l, b := s.Rule(0).LimitsForSource(c.src, c.id, "")
		l2, b2 := s.LimitsForSource(0, c.src, c.id, "")
		if l != c.limit || b != c.burst || l2 != c.limit || b2 != c.burst {
			t.Errorf("LimitsForSource(%v, %q) = %d, %d / %d, %d; want %d, %d", c.src, c.id, l, b, l2, b2, c.limit, c.burst)
		}
	}
	if got := s.Rule(0).Overrides[3].Source; got != (KeySource{}) {
		t.Errorf("an override naming the first source normalises to the zero source, got %v", got)
	}
	if l, _ := s.LimitsFor(0, "abc", ""); l != 100 {
		t.Errorf("LimitsFor is the first source's: got %d, want 100", l)
	}

	// The YAML form round-trips, and a rule without sources keeps its digest.
	out, err := Marshal(rules)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "source: user") || !strings.Contains(string(out), "source: ip") {
		t.Errorf("Marshal lost the sources:\n%s", out)
	}
	back, err := Parse("rules.yaml", out)
	if err != nil {
		t.Fatal(err)
	}
	if s2, err := NewSet(back, 1); err != nil || s2.Digest() != s.Digest() {
		t.Fatalf("round trip changed the rules (%v):\n%s", err, out)
	}
	plain := Rule{ID: "r", Key: []KeySource{{Kind: KeyIP}}, Limit: 10, Window: time.Second, Overrides: []Override{{Identity: "a", Limit: 2}}}
	named := plain
	named.Overrides = []Override{{Identity: "a", Limit: 2, Source: KeySource{Kind: KeyIP}}}
	s1, err := NewSet([]Rule{plain}, 1)
	if err != nil {
		t.Fatal(err)
	}
	s2, err := NewSet([]Rule{named}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if s1.Digest() != s2.Digest() {
		t.Errorf("source: ip on a rule keyed [ip] changed the digest")
	}
	if b, err := json.Marshal(s1.Rule(0).Overrides[0]); err != nil || strings.Contains(string(b), "Source") {
		t.Errorf("the canonical form of an override without a source names one: %s (%v)", b, err)
	}
}

func TestOverrideSourceErrors(t *testing.T) {
	for _, c := range []struct {
		name, yaml string
		want       string
		sentinel   error
	}{
		{"not in chain", "rules:\n- id: a\n  key: [header:X-Api-Key, ip]\n  limit: 1\n  window: 1s\n  overrides:\n  - {identity: x, source: user, limit: 2}\n",
			`rules.yaml:7: rules[0].overrides[0].source: "user" is not a source of the rule's key [header:X-Api-Key, ip] (rule "a")`, ErrInvalidRule},
		{"other header", "rules:\n- id: a\n  key: [header:X-Api-Key, ip]\n  limit: 1\n  window: 1s\n  overrides:\n  - identity: x\n    source: header:X-User\n    limit: 2\n",
			`rules.yaml:8: rules[0].overrides[0].source: "header:X-User" is not a source`, ErrInvalidRule},
		{"global", "rules:\n- id: a\n  key: [header:X-Api-Key, global]\n  limit: 1\n  window: 1s\n  overrides:\n  - {identity: x, source: global, limit: 2}\n",
			`rules[0].overrides[0].source: global yields no identity of its own`, ErrInvalidRule},
		{"global rule", "rules:\n- id: a\n  limit: 1\n  window: 1s\n  overrides:\n  - {identity: x, source: ip, limit: 2}\n",
			`rules[0].overrides[0].source: "ip" is not in the rule's key, which is [global]`, ErrInvalidRule},
		{"unknown kind", "rules:\n- id: a\n  key: [ip]\n  limit: 1\n  window: 1s\n  overrides:\n  - {identity: x, source: cookie, limit: 2}\n",
			`rules[0].overrides[0].source: "cookie" is not a source`, ErrInvalidRule},
		{"empty", "rules:\n- id: a\n  key: [ip]\n  limit: 1\n  window: 1s\n  overrides:\n  - {identity: x, source: '', limit: 2}\n",
			`rules.yaml:7: rules[0].overrides[0].source: must name a source of the rule's key`, ErrSyntax},
		{"mapping", "rules:\n- id: a\n  key: [ip]\n  limit: 1\n  window: 1s\n  overrides:\n  - {identity: x, source: {header: X}, limit: 2}\n",
			`rules[0].overrides[0].source: expected a string like header:X-API-Key`, ErrSyntax},
		{"duplicate in one source", "rules:\n- id: a\n  key: [header:X-Api-Key, ip]\n  limit: 1\n  window: 1s\n  overrides:\n  - {identity: x, source: ip, limit: 2}\n  - {identity: x, source: ip, limit: 3}\n",
			`rules.yaml:8: rules[0].overrides[1].identity: duplicate identity "x" of the same source, also in overrides[0]`, ErrInvalidRule},
		{"duplicate via default", "rules:\n- id: a\n  key: [header:X-Api-Key, ip]\n  limit: 1\n  window: 1s\n  overrides:\n  - {identity: x, limit: 2}\n  - {identity: x, source: header:x-api-key, limit: 3}\n",
			`rules[0].overrides[1].identity: duplicate identity "x" of the same source`, ErrInvalidRule},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("rules.yaml", []byte(c.yaml))
			if err == nil {
				t.Fatal("no error")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q\nwant it to contain %q", err, c.want)
			}
			if !errors.Is(err, c.sentinel) {
				t.Errorf("error %v does not wrap %v", err, c.sentinel)
			}
		})
	}
	// The same identity under two sources is two overrides.
	if _, err := Parse("rules.yaml", []byte("rules:\n- id: a\n  key: [header:X-Api-Key, ip]\n  limit: 1\n  window: 1s\n  overrides:\n  - {identity: x, limit: 2}\n  - {identity: x, source: ip, limit: 3}\n")); err != nil {
		t.Errorf("one identity under two sources: %v", err)
	}
}

package raftgroup

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir/quota"
)

// TestDecodeRuleBody: a JSON body reads as the rules file does, JSON's own
// forms included (escapes YAML does not know, raw line separators, any
// Unicode); errors name the field relative to the rule.
func TestDecodeRuleBody(t *testing.T) {
	r, err := DecodeRuleBody("search", []byte(`{"limit":100,"window":"1m","burst":20,
		"description":"a\/b \u2028 \u00e9 `+"\u2028 \U0001F600"+`","key":["header:X-Api-Key","ip"],
		"cost_by_method":{"post":5},"match":{"prefix":"/search","methods":["get","post"]},
		"overrides":[{"identity":"vip","limit":1000}],"penalty":{"after":3,"base":"1s","max":"1m"},"accuracy":0.1}`))
	if err != nil {
		t.Fatal(err)
	}
	if r.ID != "search" || r.Limit != 100 || r.Window != time.Minute || r.Burst != 20 || r.CostByMethod["post"] != 5 ||
		len(r.Key) != 2 || r.Overrides[0].Limit != 1000 || r.Penalty.Base != time.Second || r.Accuracy != 0.1 ||
		r.Description != "a/b \u2028 é \u2028 \U0001F600" {
		t.Fatalf("decoded %+v", r)
	}
	// RuleJSON reads back to the same rule, normalised.
	js, err := RuleJSON(r)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(js), `{"id":"search","description":`) {
		t.Fatalf("RuleJSON %s: not in quota's field order", js)
	}
	r2, err := DecodeRuleBody("search", js)
	if err != nil {
		t.Fatalf("RuleJSON's output does not decode: %v\n%s", err, js)
	}
	if a, b := digestOf(t, r), digestOf(t, r2); a != b {
		t.Fatalf("round trip changed the rule:\n%s", js)
	}
	if r, err := DecodeRuleBody("x", []byte(` {} `)); err == nil || r.ID != "" {
		t.Fatalf("an empty object: %v", err) // no limit, no window
	} else if f := fields(err); strings.Join(f, ",") != "limit,window" {
		t.Fatalf("an empty object: fields %q", f)
	}

	deep := strings.Repeat(`{"a":`, 40) + "1" + strings.Repeat("}", 40)
	for _, tc := range []struct {
		body, field string
		is          error
	}{
		{``, "", quota.ErrSyntax},
		{`{"limit": 1, "window": "1m"} x`, "", quota.ErrSyntax},
		{`{"limit": 1, "limit": 2, "window": "1m"}`, "limit", quota.ErrSyntax},
		{`{"limit": "1", "window": "1m"}`, "limit", quota.ErrSyntax},
		{`{"limit": 1.5, "window": "1m"}`, "limit", quota.ErrSyntax},
		{`{"limit": 1, "window": "1m", "burst": 0}`, "burst", quota.ErrSyntax},
		{`{"limit": 1, "window": "1m", "match": ` + deep + `}`, "", quota.ErrSyntax},
		{`{"id": 7, "limit": 1, "window": "1m"}`, "id", quota.ErrSyntax},
		{`{"limit": 1, "window": "1m", "algorithm": "fixed_window", "scope": "global"}`, "scope", quota.ErrInvalidRule},
		{`{"limit": 1, "window": "1m", "overrides": [{"identity": "a", "burst": 0}]}`, "overrides[0].burst", quota.ErrSyntax},
		{"\"\\ud800\"", "", quota.ErrSyntax},
	} {
		_, err := DecodeRuleBody("x", []byte(tc.body))
		if !errors.Is(err, tc.is) {
			t.Errorf("%q: %v, want %v", tc.body, err, tc.is)
			continue
		}
		if f := fields(err); len(f) == 0 || f[0] != tc.field {
			t.Errorf("%q: fields %q, want %q first (%v)", tc.body, f, tc.field, err)
		}
		if strings.Contains(err.Error(), "line ") || strings.Contains(err.Error(), "rules[") {
			t.Errorf("%q: %q speaks of the wrapper, not the body", tc.body, err)
		}
	}
}

func digestOf(t testing.TB, r quota.Rule) string {
	t.Helper()
	s, err := quota.NewSet([]quota.Rule{r}, 1)
	if err != nil {
		t.Fatal(err)
	}
	return s.Digest()
}

// TestAdminConfig: a bad config is refused, naming the field, and a
// token's text never appears in the error.
func TestAdminConfig(t *testing.T) {
	store := (*Group)(nil)
	for _, tc := range []struct {
		cfg  AdminConfig
		want string
	}{
		{AdminConfig{}, "Store"},
		{AdminConfig{Store: store, Tokens: map[string]string{"short-secret": "alice"}}, `Tokens: the token of "alice"`},
		{AdminConfig{Store: store, Tokens: map[string]string{aliceToken: ""}}, "empty principal"},
		{AdminConfig{Store: store, MaxBodyBytes: -1}, "MaxBodyBytes"},
	} {
		_, err := AdminHandler(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.cfg, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "short-secret") {
			t.Errorf("the error shows the token: %v", err)
		}
	}
}

// FuzzDecodeRuleBody: the admin API's body decoder never panics; its
// errors are quota's, syntax or validation; what it accepts is a valid
// rule with the path's id, and RuleJSON of it decodes back to the same
// rule.
func FuzzDecodeRuleBody(f *testing.F) {
	for _, s := range []string{
		`{"limit":100,"window":"1m","burst":20}`,
		`{"id":"x","limit":10000,"window":"1m","burst":600,"cost":2,"cost_by_method":{"POST":5},"scope":"global"}`,
		`{"limit":5,"window":"1s","key":["header:X-Api-Key","ip","global"],"match":{"pattern":"/v1/users/{id}/*","methods":["GET"]}}`,
		`{"limit":5,"window":"1s","tiers":[{"name":"gold","limit":50}],"penalty":{"after":3,"within":"1m","base":"1s","max":"1h"}}`,
		`{"limit":5,"window":"1s","sketch":{"threshold":4},"description":"\u00e9\/\n"}`,
		`{"limit":5,"window":"1s","algorithm":"leaky_bucket","max_delay":"2s","mode":"local"}`,
		`{"limit": 1,`, `[]`, `null`, `{"id":"y"}`, `{"limit":1,"window":"1m"} {}`, `{"a":{"b":[[[[1]]]]}}`,
	} {
		f.Add("x", []byte(s))
	}
	f.Fuzz(func(t *testing.T, id string, body []byte) {
		r, err := DecodeRuleBody(id, body)
		if err != nil {
			if !errors.Is(err, quota.ErrSyntax) && !errors.Is(err, quota.ErrInvalidRule) {
				t.Fatalf("error %v is neither a syntax nor a validation error", err)
			}
			return
		}
		if r.ID != id {
			t.Fatalf("decoded id %q, path id %q", r.ID, id)
		}
		if err := quota.Validate([]quota.Rule{r}); err != nil {
			t.Fatalf("an accepted body is invalid: %v", err)
		}
		js, err := RuleJSON(r)
		if err != nil {
			t.Fatal(err)
		}
		r2, err := DecodeRuleBody(id, js)
		if err != nil {
			t.Fatalf("RuleJSON %s does not decode: %v", js, err)
		}
		if digestOf(t, r) != digestOf(t, r2) {
			t.Fatalf("RuleJSON %s decodes to another rule", js)
		}
	})
}

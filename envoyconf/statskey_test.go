package envoyconf

import "testing"

// TestStatsKeyValueToMetric holds Match.StatsKey to the stats names
// envoyproxy/ratelimit's own config tests expect (TestValueToMetric_* and
// TestDetailedMetric in its test/config), after the domain.
func TestStatsKeyValueToMetric(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		entries    []Entry
		want       string // "" when the stats name is the configured path
		configured string // Limit.StatsKey
	}{
		{"runtime values", `
domain: d
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 60}
`, []Entry{{"route", "draw"}, {"http_method", "GET"}, {"subject_id", "123"}}, "route_draw.http_method_GET.subject_id", "route.http_method.subject_id"},
		{"default key at that level", `
domain: d
descriptors:
  - key: k1
    value_to_metric: true
    descriptors:
      - key: k2
        rate_limit: {unit: second, requests_per_unit: 1}
`, []Entry{{"k1", "A"}, {"k2", "foo"}}, "k1_A.k2", "k1.k2"},
		{"mid level only", `
domain: d
descriptors:
  - key: k1
    descriptors:
      - key: k2
        value_to_metric: true
        descriptors:
          - key: k3
            rate_limit: {unit: second, requests_per_unit: 1}
`, []Entry{{"k1", "X"}, {"k2", "Y"}, {"k3", "Z"}}, "k1.k2_Y.k3", "k1.k2.k3"},
		{"no flag", `
domain: d
descriptors:
  - key: k1
    descriptors:
      - key: k2
        rate_limit: {unit: second, requests_per_unit: 1}
`, []Entry{{"k1", "X"}, {"k2", "Y"}}, "", "k1.k2"},
		{"detailed_metric wins", `
domain: d
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            detailed_metric: true
            rate_limit: {unit: minute, requests_per_unit: 60}
`, []Entry{{"route", "draw"}, {"http_method", "GET"}, {"subject_id", "123"}}, "route_draw.http_method_GET.subject_id_123", "route.http_method.subject_id"},
		{"configured values", `
domain: d
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value: POST
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 30}
`, []Entry{{"route", "api"}, {"http_method", "POST"}, {"subject_id", "user456"}}, "route_api.http_method_POST.subject_id", "route.http_method_POST.subject_id"},
		{"wildcard", `
domain: d
descriptors:
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit: {unit: minute, requests_per_unit: 100}
`, []Entry{{"user", "alice"}, {"action", "readfile"}, {"resource", "documents"}}, "user_alice.action_readfile.resource", "user.action_read*.resource"},
		{"wildcard without the flag keeps the pattern", `
domain: d
descriptors:
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        descriptors:
          - key: resource
            rate_limit: {unit: minute, requests_per_unit: 100}
`, []Entry{{"user", "bob"}, {"action", "readdata"}, {"resource", "db"}}, "user_bob.action_read*.resource", "user.action_read*.resource"},
		{"share_threshold keeps the pattern", `
domain: d
descriptors:
  - key: files
    value: top*
    share_threshold: true
    value_to_metric: true
    rate_limit: {unit: hour, requests_per_unit: 10}
`, []Entry{{"files", "top-1"}}, "files_top*", "files_top*"},
		{"empty values", `
domain: d
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 60}
`, []Entry{{"route", ""}, {"http_method", "GET"}, {"subject_id", "1"}}, "route.http_method_GET.subject_id", "route.http_method.subject_id"},
		{"detailed_metric alone", `
domain: d
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 5}
`, []Entry{{"key1", "value1"}}, "key1_value1", "key1"},
		{"detailed_metric, an empty value", `
domain: d
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 5}
`, []Entry{{"key1", ""}}, "key1_", "key1"},
		{"detailed_metric with share_threshold", `
domain: d
descriptors:
  - key: files
    value: top*
    share_threshold: true
    descriptors:
      - key: user
        detailed_metric: true
        rate_limit: {unit: hour, requests_per_unit: 10}
`, []Entry{{"files", "top-1"}, {"user", "u1"}}, "files_top*.user_u1", "files_top*.user"},
		{"sanitized as the configured path", `
domain: d
descriptors:
  - key: remote_address
    value_to_metric: true
    rate_limit: {unit: second, requests_per_unit: 5}
`, []Entry{{"remote_address", "10.0.0.1:80|x"}}, "remote_address_10_0_0_1_80_x", "remote_address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := Parse("t.yaml", []byte(tc.yaml))
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := Compile(Options{}, d)
			if err != nil {
				t.Fatal(err)
			}
			m, ok := cfg.Match("d", tc.entries)
			if !ok {
				t.Fatalf("no match for %v", tc.entries)
			}
			if m.StatsKey != tc.want && !(tc.want == "" && m.StatsKey == m.Limit.StatsKey) {
				t.Errorf("StatsKey %q, want %q", m.StatsKey, tc.want)
			}
			if m.Limit.StatsKey != tc.configured {
				t.Errorf("Limit.StatsKey %q, want %q", m.Limit.StatsKey, tc.configured)
			}
		})
	}
}

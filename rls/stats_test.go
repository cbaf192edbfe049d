package rls_test

import (
	"context"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/envoyconf"
	"github.com/weir-dev/weir/rls"
)

// TestDescriptorStats sends requests over gRPC on loopback and reads the
// per-descriptor hit counters back from a Prometheus registry: hits, not
// requests, split into within, over and near the limit (NEAR_LIMIT_RATIO
// 0.8) as envoyproxy/ratelimit's base limiter splits them, shadow_mode for
// a shadow descriptor over its limit, requests_per_unit 0 all over, an
// unlimited descriptor not counted, and one series per configured path
// whatever the values.
func TestDescriptorStats(t *testing.T) {
	d, err := envoyconf.Parse("stats.yaml", []byte(`domain: d
descriptors:
  - key: k
    rate_limit: {unit: day, requests_per_unit: 10}
    descriptors:
      - key: path
        value: /a
        rate_limit: {unit: day, requests_per_unit: 5}
  - key: s
    shadow_mode: true
    rate_limit: {unit: day, requests_per_unit: 2}
  - key: z
    rate_limit: {unit: day, requests_per_unit: 0}
  - key: u
    rate_limit: {unlimited: true}
`))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := envoyconf.Compile(envoyconf.Options{FixedWindow: true}, d)
	if err != nil {
		t.Fatal(err)
	}
	node, err := weir.New(weir.Config{Rules: cfg.Rules()})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	svc := rls.New(node, cfg)
	reg := prometheus.NewRegistry()
	reg.MustRegister(svc.Collector())
	srv, err := rls.Listen("127.0.0.1:0", svc)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	c := client(t, srv.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type call struct {
		hits uint32
		want rlsv3.RateLimitResponse_Code
		kv   []string
	}
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	for i, cl := range []call{
		{7, ok, []string{"k", "v1"}},   // used 7 of 10: within
		{2, ok, []string{"k", "v1"}},   // used 9: 1 hit above the near threshold 8
		{3, over, []string{"k", "v1"}}, // 9 + 3: 2 over, 1 near (9 to 10)
		{1, ok, []string{"k", "v1"}},   // used 10: 1 near
		{4, ok, []string{"k", "v2"}},   // another value, the same series
		{6, over, []string{"k", "v3", "path", "/a"}},
		{3, ok, []string{"s", "x"}}, // shadow 2 a day: 1 over, 1 near, answered OK
		{2, over, []string{"z", "x"}},
		{5, ok, []string{"u", "x"}},
	} {
		resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d", HitsAddend: cl.hits, Descriptors: []*commonv3.RateLimitDescriptor{desc(cl.kv...)}})
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if resp.OverallCode != cl.want {
			t.Fatalf("call %d %v: %v, want %v", i, cl.kv, resp.OverallCode, cl.want)
		}
	}
	got := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var dom, desc string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "domain":
					dom = l.GetValue()
				case "descriptor":
					desc = l.GetValue()
				}
			}
			got[mf.GetName()+" "+dom+" "+desc] = m.GetCounter().GetValue()
		}
	}
	want := map[string]float64{}
	set := func(desc string, total, within, over, near, shadow float64) {
		want["weir_envoy_hits_total d "+desc] = total
		want["weir_envoy_within_limit_hits_total d "+desc] = within
		want["weir_envoy_over_limit_hits_total d "+desc] = over
		want["weir_envoy_near_limit_hits_total d "+desc] = near
		want["weir_envoy_shadow_mode_hits_total d "+desc] = shadow
	}
	set("k", 17, 14, 2, 3, 0)
	set("k.path_/a", 6, 0, 1, 1, 0) // 0 + 6 of 5: 1 over, 1 near (4 to 5)
	set("s", 3, 0, 1, 1, 1)
	set("z", 2, 0, 2, 0, 0)
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s = %v, want %v", k, got[k], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d series, want %d (one per configured limited path): %v", len(got), len(want), got)
	}
	noFailOpen(t, node)
}

// gatherStats reads every series of reg as "name domain descriptor".
func gatherStats(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var dom, desc string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "domain":
					dom = l.GetValue()
				case "descriptor":
					desc = l.GetValue()
				}
			}
			got[mf.GetName()+" "+dom+" "+desc] = m.GetCounter().GetValue()
		}
	}
	return got
}

// TestValueToMetricStats: a descriptor with value_to_metric counts under
// the name envoyproxy/ratelimit gives it, with the request's value in it,
// up to the cap of WithValueSeries distinct names per configured
// descriptor; later values are counted under the configured path and in
// weir_envoy_value_series_overflow_total. A value name that equals
// another descriptor's configured path is one series with it, summed, as
// envoyproxy/ratelimit's counters are by name. In every mode.
func TestValueToMetricStats(t *testing.T) {
	for _, opts := range []envoyconf.Options{{}, {Fidelity: true}} {
		t.Run(map[bool]string{false: "default", true: "fidelity"}[opts.Fidelity], func(t *testing.T) {
			d, err := envoyconf.Parse("v2m.yaml", []byte(`domain: d
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: {unit: day, requests_per_unit: 100}
  - key: plain
    rate_limit: {unit: day, requests_per_unit: 100}
  - key: user
    detailed_metric: true
    rate_limit: {unit: day, requests_per_unit: 100}
  - key: route
    value: a_b
    descriptors:
      - key: method
        rate_limit: {unit: day, requests_per_unit: 100}
`))
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := envoyconf.Compile(opts, d)
			if err != nil {
				t.Fatal(err)
			}
			node, err := weir.New(weir.Config{Rules: cfg.Rules()})
			if err != nil {
				t.Fatal(err)
			}
			defer node.Close()
			svc := rls.New(node, cfg, rls.WithValueSeries(2))
			reg := prometheus.NewRegistry()
			reg.MustRegister(svc.Collector())
			ctx := context.Background()
			for i, kv := range [][]string{
				{"route", "a", "method", "GET"},
				{"route", "a", "method", "POST"},  // the same name: route_a.method
				{"route", "a:b", "method", "GET"}, // the second name, route_a_b.method (sanitized)
				{"route", "c", "method", "GET"},   // past the cap of 2: under route.method
				{"route", "d", "method", "GET"},   // and again
				{"route", "a", "method", "GET"},   // a name it has
				{"route", "a_b", "method", "GET"}, // the configured route_a_b.method: one series with it
				{"plain", "p1"},
				{"plain", "p2"},
				{"user", "u1"},
				{"user", "u2"},
				{"user", "u3"},
			} {
				resp, err := svc.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*commonv3.RateLimitDescriptor{desc(kv...)}})
				if err != nil {
					t.Fatalf("call %d: %v", i, err)
				}
				if resp.OverallCode != rlsv3.RateLimitResponse_OK {
					t.Fatalf("call %d %v: %v", i, kv, resp.OverallCode)
				}
			}
			got := gatherStats(t, reg)
			for desc, hits := range map[string]float64{
				"route_a.method": 3, "route_a_b.method": 2, "route.method": 2,
				"plain": 2, "user_u1": 1, "user_u2": 1, "user": 1,
			} {
				for _, name := range []string{"weir_envoy_hits_total", "weir_envoy_within_limit_hits_total"} {
					if k := name + " d " + desc; got[k] != hits {
						t.Errorf("%s = %v, want %v", k, got[k], hits)
					}
				}
			}
			for desc, n := range map[string]float64{"route.method": 2, "user": 1} {
				if k := "weir_envoy_value_series_overflow_total d " + desc; got[k] != n {
					t.Errorf("%s = %v, want %v", k, got[k], n)
				}
			}
			if k := "weir_envoy_value_series_overflow_total d plain"; got[k] != 0 {
				t.Errorf("%s = %v: a descriptor without value_to_metric has no value series", k, got[k])
			}
			series := 0
			for k := range got {
				if strings.HasPrefix(k, "weir_envoy_hits_total ") {
					series++
				}
			}
			if series != 7 { // route.method, route_a, route_a_b (with the configured one), plain, user, user_u1, user_u2
				t.Errorf("%d series of weir_envoy_hits_total, want 7: %v", series, got)
			}
			noFailOpen(t, node)
		})
	}
}

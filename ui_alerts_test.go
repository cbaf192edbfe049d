package weir_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"github.com/weir-dev/weir"
)

// pendingMetrics are metrics the alerts and the dashboard use that this
// test's node does not export: weir_global_fallback{rule} is exported only
// by a node that leases global rules (a cluster and a lease group), and
// TestGlobalLeaseGroupStopped reads it there.
var pendingMetrics = map[string]bool{"weir_global_fallback": true}

// exportedMetrics registers a node's real collector (with a canary, a rule
// and a decision, so that every family has a sample) and gathers the names.
func exportedMetrics(t *testing.T) map[string]prometheus.Collector {
	t.Helper()
	reg := prometheus.NewRegistry()
	rules := parseRules(t, `
rules:
  - id: weir-canary
    key: [header:X-Weir-Canary]
    match: {path: /weir-canary}
    limit: 1
    window: 1s
`)
	n := newNode(t, weir.Config{Rules: rules, Registerer: reg, Canary: &weir.CanaryConfig{Rule: "weir-canary"}})
	n.Allow(context.Background(), weir.Request{Method: "GET", Path: "/weir-canary", Header: http.Header{"X-Weir-Canary": {"x"}}})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]prometheus.Collector{}
	for _, mf := range mfs {
		out[mf.GetName()] = nil
		if mf.GetType().String() == "HISTOGRAM" {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				out[mf.GetName()+s] = nil
			}
		}
	}
	return out
}

var metricName = regexp.MustCompile(`\bweir_[a-zA-Z0-9_]+`)

// checkNames fails for every metric in expr that weir does not export.
func checkNames(t *testing.T, where, expr string, exported map[string]prometheus.Collector, used map[string]bool) {
	t.Helper()
	names := metricName.FindAllString(expr, -1)
	if len(names) == 0 {
		t.Errorf("%s: the expression names no weir metric: %s", where, expr)
	}
	for _, name := range names {
		used[name] = true
		if _, ok := exported[name]; ok {
			if pendingMetrics[name] {
				t.Logf("%s: %s is exported now: remove it from pendingMetrics", where, name)
			}
			continue
		}
		if !pendingMetrics[name] {
			t.Errorf("%s: metric %s is not one weir exports", where, name)
		}
	}
}

// TestAlertsAndDashboardUseExportedMetrics parses docs/alerts.yml and
// docs/dashboard.json and checks that every metric they name is exported
// by weir's collector (or is listed as pending), that every alert has a
// severity, a summary and a runbook section that exists in
// docs/operations.md, and that the alerts cover what the docs promise.
func TestAlertsAndDashboardUseExportedMetrics(t *testing.T) {
	exported := exportedMetrics(t)
	used := map[string]bool{}

	raw, err := os.ReadFile("docs/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var alerts struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Expr        string            `yaml:"expr"`
				For         string            `yaml:"for"`
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	dec := yaml.NewDecoder(strings.NewReader(string(raw)))
	dec.KnownFields(true)
	if err := dec.Decode(&alerts); err != nil {
		t.Fatalf("docs/alerts.yml: %v", err)
	}
	ops, err := os.ReadFile("docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, g := range alerts.Groups {
		for _, r := range g.Rules {
			names = append(names, r.Alert)
			where := "docs/alerts.yml " + r.Alert
			checkNames(t, where, r.Expr, exported, used)
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("%s: needs labels.severity and annotations.summary", where)
			}
			anchor := "docs/operations.md#" + strings.ToLower(r.Alert)
			if r.Annotations["runbook"] != anchor {
				t.Errorf("%s: runbook %q, want %q", where, r.Annotations["runbook"], anchor)
			}
			if !strings.Contains(string(ops), "### "+r.Alert+"\n") {
				t.Errorf("%s: docs/operations.md has no section \"### %s\"", where, r.Alert)
			}
		}
	}
	for _, want := range []string{"WeirFailOpen", "WeirGlobalFallback", "WeirRejectRateJumpAfterRuleChange",
		"WeirRulesVersionBehind", "WeirKeysGrowingFast", "WeirKeysAtCap", "WeirCanaryNotRejecting"} {
		if !slices.Contains(names, want) {
			t.Errorf("docs/alerts.yml lacks the alert %s", want)
		}
	}

	raw, err = os.ReadFile("docs/dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string `json:"title"`
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("docs/dashboard.json: %v", err)
	}
	if dash.Title == "" || dash.UID == "" || len(dash.Panels) == 0 {
		t.Fatalf("docs/dashboard.json: no title, uid or panels")
	}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("dashboard panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			checkNames(t, "docs/dashboard.json panel "+p.Title, q.Expr, exported, used)
		}
	}
	// Every metric weir exports is on the dashboard.
	var missing []string
	for name := range exported {
		if !used[name] && !strings.HasSuffix(name, "_bucket") && !strings.HasSuffix(name, "_sum") && !strings.HasSuffix(name, "_count") {
			if name == "weir_decision_duration_seconds" {
				continue // shown through its _bucket, _sum and _count series
			}
			missing = append(missing, name)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("exported but on no dashboard panel: %v", missing)
	}
}

package weir

import (
	"sort"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/weir-dev/weir/bucket"
)

// counterStripes spreads a hot counter over cache lines so that decisions on
// two cores do not fight over one; the stripes are summed at scrape time.
const counterStripes = 8

type paddedCounter struct {
	n atomic.Uint64
	_ [56]byte
}

// stripedCounter is a counter for the hot path: add touches one stripe
// chosen by the caller (the request's key), load sums them.
type stripedCounter struct{ s [counterStripes]paddedCounter }

func (c *stripedCounter) add(stripe uint64) { c.s[stripe%counterStripes].n.Add(1) }

func (c *stripedCounter) load() uint64 {
	var t uint64
	for i := range c.s {
		t += c.s[i].n.Load()
	}
	return t
}

// ruleStats are one rule's counters. They belong to the rule id, not to a
// rule-set version, so a reload does not reset them.
type ruleStats struct {
	allowed, rejected, shadow, lockouts, degraded stripedCounter
}

func (n *Node) statsFor(id string) *ruleStats {
	n.mu.Lock()
	defer n.mu.Unlock()
	s, ok := n.ruleStats[id]
	if !ok {
		s = &ruleStats{}
		n.ruleStats[id] = s
	}
	return s
}

// RuleCounts are one rule's decision counts since the node started.
type RuleCounts struct {
	Rule           string `json:"rule"`
	Allowed        uint64 `json:"allowed"`
	Rejected       uint64 `json:"rejected"`
	ShadowRejected uint64 `json:"shadow_rejected"`
	Lockouts       uint64 `json:"lockouts"`
	// FailOpen counts decisions made by on_failure because the owner was
	// unreachable; it is zero in a healthy cluster and should alert.
	FailOpen uint64 `json:"fail_open"`
}

// counts returns every rule's decision counts, sorted by rule id. Rules
// removed by a reload keep their last counts.
func (n *Node) counts() []RuleCounts {
	n.mu.Lock()
	out := make([]RuleCounts, 0, len(n.ruleStats))
	for id, s := range n.ruleStats {
		out = append(out, RuleCounts{Rule: id, Allowed: s.allowed.load(), Rejected: s.rejected.load(),
			ShadowRejected: s.shadow.load(), Lockouts: s.lockouts.load(), FailOpen: s.degraded.load()})
	}
	n.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Rule < out[j].Rule })
	return out
}

// metrics is weir's Prometheus collector. Counters live in the rules' striped
// counters and the stores; Collect reads them at scrape time, so the hot
// path never touches a Prometheus object.
type metrics struct {
	n            *Node
	reloadErrors prometheus.Counter
	// rulesWentBack counts the times the lease group's rule set went back
	// to an older version than the node's (lease_node.go).
	rulesWentBack prometheus.Counter
	latency       prometheus.Histogram // safe for concurrent use on its own

	decisions, failOpen, keysLive, keysEvicted, versionDesc, defaults, behind *prometheus.Desc

	globalLeased, globalFallback, globalShare, globalReports *prometheus.Desc
	canaryOK, canaryProbes, keysMax                          *prometheus.Desc
	adminUnauthorized                                        *prometheus.Desc
	keysForgivenTokens, keysForgivenSeconds                  *prometheus.Desc
}

func newMetrics(n *Node) *metrics {
	return &metrics{
		n: n,
		reloadErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "weir_rules_reload_errors_total",
			Help: "Rule loads or reloads that failed; the last good rule set stayed in force.",
		}),
		rulesWentBack: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "weir_rules_went_back_total",
			Help: "Times the lease group's rule set was older than the node's (the group lost acknowledged rule changes); the node installed the group's set.",
		}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "weir_decision_duration_seconds",
			Help:    "Time to decide one request (Node.Allow), sampled one decision in 64.",
			Buckets: []float64{50e-9, 100e-9, 250e-9, 500e-9, 1e-6, 2.5e-6, 10e-6, 100e-6, 1e-3},
		}),
		decisions: prometheus.NewDesc("weir_decisions_total",
			"Rule verdicts by rule and outcome (allowed, rejected, shadow_rejected, locked_out).",
			[]string{"rule", "outcome"}, nil),
		failOpen: prometheus.NewDesc("weir_fail_open_total",
			"Decisions made by a rule's on_failure policy because the identity's owner was unreachable. Alert when it grows.",
			[]string{"rule"}, nil),
		keysLive: prometheus.NewDesc("weir_keys_live",
			"Keys holding state, by algorithm store.", []string{"store"}, nil),
		keysEvicted: prometheus.NewDesc("weir_keys_evicted_total",
			"Keys removed from a store: idle (full, same as no entry) or forgiven (partly spent, evicted at the key cap).",
			[]string{"store", "reason"}, nil),
		keysForgivenTokens: prometheus.NewDesc("weir_keys_forgiven_tokens_total",
			"Tokens the keys evicted at the key cap had spent, forgiven with them, by store (the stores that count tokens: fixed_window, sliding_window, sliding_log, concurrency).",
			[]string{"store"}, nil),
		keysForgivenSeconds: prometheus.NewDesc("weir_keys_forgiven_seconds_total",
			"Time the keys evicted at the key cap owed, forgiven with them, by store (the stores that hold a time: gcra, the time until the bucket is full again; leaky_bucket, the queue's drain; penalty, the lockout's rest).",
			[]string{"store"}, nil),
		versionDesc: prometheus.NewDesc("weir_rules_version",
			"Version of the rule set in force on this node.", nil, nil),
		behind: prometheus.NewDesc("weir_rules_versions_behind",
			"How many versions the rules in force trail the newest version heard of from the lease group or a peer's gossip (0 without a lease group). Alert when it stays above 0.", nil, nil),
		defaults: prometheus.NewDesc("weir_rules_defaults_active",
			"1 while the node enforces Config.DefaultRules because its rule file could not be loaded.", nil, nil),
		globalLeased: prometheus.NewDesc("weir_global_leased",
			"Identities of a scope: global rule that this node owns and enforces at an unexpired lease of its region's share.",
			[]string{"rule"}, nil),
		globalFallback: prometheus.NewDesc("weir_global_fallback",
			"Identities of a scope: global rule that this node owns and enforces at the fallback (no lease yet, or expired): alert when it stays above 0.",
			[]string{"rule"}, nil),
		globalShare: prometheus.NewDesc("weir_global_share",
			"Sum of the leased shares (tokens per window) of the identities of a scope: global rule that this node owns.",
			[]string{"rule"}, nil),
		globalReports: prometheus.NewDesc("weir_global_reports_total",
			"Demand reports this node sent to the lease group, by outcome (ok, failed).",
			[]string{"outcome"}, nil),
		keysMax: prometheus.NewDesc("weir_keys_max",
			"The key cap of each store (Config.MaxKeys): at it, full buckets are evicted first and then partly spent ones are forgiven (weir_keys_evicted_total{reason=\"forgiven\"}).", nil, nil),
		canaryOK: prometheus.NewDesc("weir_canary_ok",
			"1 while the enforcement canary saw a rejection of its probes within its window (or is in its first window), 0 when it did not: enforcement may have stopped. Exported only with Config.Canary.", nil, nil),
		canaryProbes: prometheus.NewDesc("weir_canary_probes_total",
			"Enforcement canary probes by outcome (allowed, rejected, error). Exported only with Config.Canary.", []string{"outcome"}, nil),
		adminUnauthorized: prometheus.NewDesc("weir_admin_unauthorized_total",
			"Requests the admin door refused (no valid token or client certificate) on the rules API, the admin report and the identity look-up. Alert when it grows.", nil, nil),
	}
}

func (m *metrics) observeLatency(d time.Duration) { m.latency.Observe(d.Seconds()) }

// Describe implements prometheus.Collector.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	m.reloadErrors.Describe(ch)
	m.rulesWentBack.Describe(ch)
	m.latency.Describe(ch)
	ch <- m.decisions
	ch <- m.failOpen
	ch <- m.keysLive
	ch <- m.keysEvicted
	ch <- m.keysForgivenTokens
	ch <- m.keysForgivenSeconds
	ch <- m.versionDesc
	ch <- m.defaults
	ch <- m.behind
	ch <- m.globalLeased
	ch <- m.globalFallback
	ch <- m.globalShare
	ch <- m.globalReports
	ch <- m.canaryOK
	ch <- m.canaryProbes
	ch <- m.keysMax
	ch <- m.adminUnauthorized
}

// Collect implements prometheus.Collector.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	m.reloadErrors.Collect(ch)
	m.rulesWentBack.Collect(ch)
	m.latency.Collect(ch)
	for _, c := range m.n.counts() {
		ch <- prometheus.MustNewConstMetric(m.decisions, prometheus.CounterValue, float64(c.Allowed), c.Rule, "allowed")
		ch <- prometheus.MustNewConstMetric(m.decisions, prometheus.CounterValue, float64(c.Rejected), c.Rule, "rejected")
		ch <- prometheus.MustNewConstMetric(m.decisions, prometheus.CounterValue, float64(c.ShadowRejected), c.Rule, "shadow_rejected")
		ch <- prometheus.MustNewConstMetric(m.decisions, prometheus.CounterValue, float64(c.Lockouts), c.Rule, "locked_out")
		ch <- prometheus.MustNewConstMetric(m.failOpen, prometheus.CounterValue, float64(c.FailOpen), c.Rule)
	}
	for _, s := range m.n.stores.stats() {
		ch <- prometheus.MustNewConstMetric(m.keysLive, prometheus.GaugeValue, float64(s.Live), s.Name)
		ch <- prometheus.MustNewConstMetric(m.keysEvicted, prometheus.CounterValue, float64(s.EvictedIdle), s.Name, "idle")
		ch <- prometheus.MustNewConstMetric(m.keysEvicted, prometheus.CounterValue, float64(s.EvictedForgiven), s.Name, "forgiven")
		if timeStore(s.Name) {
			ch <- prometheus.MustNewConstMetric(m.keysForgivenSeconds, prometheus.CounterValue, s.ForgivenSeconds, s.Name)
		} else {
			ch <- prometheus.MustNewConstMetric(m.keysForgivenTokens, prometheus.CounterValue, float64(s.ForgivenTokens), s.Name)
		}
	}
	if e := m.n.eng.load(); e != nil { // nil only while New is still loading rules
		ch <- prometheus.MustNewConstMetric(m.versionDesc, prometheus.GaugeValue, float64(e.set.Version()))
	}
	def := 0.0
	if m.n.Status().UsingDefaultRules {
		def = 1
	}
	ch <- prometheus.MustNewConstMetric(m.defaults, prometheus.GaugeValue, def)
	ch <- prometheus.MustNewConstMetric(m.behind, prometheus.GaugeValue, float64(m.n.rulesBehind()))
	if gs := m.n.globalStatus(); gs.Leasing {
		for _, r := range gs.Rules {
			ch <- prometheus.MustNewConstMetric(m.globalLeased, prometheus.GaugeValue, float64(r.Leased), r.Rule)
			ch <- prometheus.MustNewConstMetric(m.globalFallback, prometheus.GaugeValue, float64(r.Fallback), r.Rule)
			ch <- prometheus.MustNewConstMetric(m.globalShare, prometheus.GaugeValue, float64(r.Share), r.Rule)
		}
		ch <- prometheus.MustNewConstMetric(m.globalReports, prometheus.CounterValue, float64(gs.Reports), "ok")
		ch <- prometheus.MustNewConstMetric(m.globalReports, prometheus.CounterValue, float64(gs.ReportFailures), "failed")
	}
	maxKeys := m.n.cfg.MaxKeys
	if maxKeys == 0 {
		maxKeys = bucket.DefaultMaxKeys
	}
	ch <- prometheus.MustNewConstMetric(m.keysMax, prometheus.GaugeValue, float64(maxKeys))
	ch <- prometheus.MustNewConstMetric(m.adminUnauthorized, prometheus.CounterValue, float64(m.n.adminUnauthorized()))
	if c := m.n.canaryStatus(); c.Enabled {
		ok := 0.0
		if c.OK {
			ok = 1
		}
		ch <- prometheus.MustNewConstMetric(m.canaryOK, prometheus.GaugeValue, ok)
		ch <- prometheus.MustNewConstMetric(m.canaryProbes, prometheus.CounterValue, float64(c.Allowed), CanaryAllowed)
		ch <- prometheus.MustNewConstMetric(m.canaryProbes, prometheus.CounterValue, float64(c.Rejected), CanaryRejected)
		ch <- prometheus.MustNewConstMetric(m.canaryProbes, prometheus.CounterValue, float64(c.Errors), CanaryError)
	}
}

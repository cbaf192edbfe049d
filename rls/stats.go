package rls

import (
	"math"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/weir-dev/weir/envoyconf"
)

// NearLimitRatio is the fraction of a limit above which hits count as near
// the limit (weir_envoy_near_limit_hits_total), envoyproxy/ratelimit's
// default NEAR_LIMIT_RATIO.
const NearLimitRatio = 0.8

// descriptorStats are one configured descriptor's hit counters, the ones
// envoyproxy/ratelimit keeps as ratelimit.service.rate_limit.<domain>.<key>.*
// and counted as it counts them (in hits, a request's hits_addend, not in
// requests). They belong to the descriptor's path, not to a configuration,
// so a reload does not reset them. Plain atomics: a call already costs
// microseconds of gRPC, and one descriptor's counters are touched once per
// call.
type descriptorStats struct {
	total, within, over, near, shadow atomic.Uint64
}

type statsKey struct{ domain, descriptor string }

// statsTable holds every descriptor's counters ever configured: bounded by
// the configured descriptor paths, never by request values.
type statsTable struct {
	mu sync.Mutex
	m  map[statsKey]*descriptorStats
}

// served is a configuration with its limits' counters, swapped whole.
type served struct {
	cfg   *envoyconf.Config
	stats map[*envoyconf.Limit]*descriptorStats
}

// serve resolves cfg's limits to their counters, creating the missing ones.
func (t *statsTable) serve(cfg *envoyconf.Config) *served {
	sv := &served{cfg: cfg, stats: map[*envoyconf.Limit]*descriptorStats{}}
	if cfg == nil {
		return sv
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[statsKey]*descriptorStats{}
	}
	for _, l := range cfg.Limits() {
		if l.Unlimited { // envoyproxy/ratelimit counts nothing for them
			continue
		}
		k := statsKey{l.Domain, l.StatsKey}
		st := t.m[k]
		if st == nil {
			st = &descriptorStats{}
			t.m[k] = st
		}
		sv.stats[l] = st
	}
	return sv
}

// count adds one descriptor's answer: limit is requests_per_unit, hits the
// descriptor's cost, over whether the limit refused it (or would have, in
// shadow mode), remaining weir's remaining (after the charge when it
// passed, the unspent rest when it did not). The split into within, over
// and near follows envoyproxy/ratelimit's base limiter with the tokens
// used, limit − remaining, as its window's count; a refused request's hits
// were not charged, so the count before it is limit − remaining.
func (s *descriptorStats) count(limit, hits uint64, over, shadow bool, remaining uint64) {
	if s == nil { // a limit of no served configuration: not possible, but never a panic
		return
	}
	s.total.Add(hits)
	near := uint64(math.Floor(float64(float32(limit) * NearLimitRatio)))
	used := limit - min(remaining, limit)
	if !over {
		s.within.Add(hits)
		before := used - min(hits, used)
		if used > near {
			s.near.Add(used - max(near, before))
		}
		return
	}
	before, after := used, used+hits
	overHits := hits
	if before < limit {
		overHits = after - limit
		s.near.Add(limit - max(near, before))
	}
	s.over.Add(overHits)
	if shadow {
		s.shadow.Add(overHits)
	}
}

// collector exports the statsTable.
type collector struct {
	t                                 *statsTable
	total, within, over, near, shadow *prometheus.Desc
}

// Collector returns a Prometheus collector of the service's per-descriptor
// hit counters, the counterparts of envoyproxy/ratelimit's
// ratelimit.service.rate_limit.<domain>.<descriptor>.{total_hits,
// within_limit, over_limit, near_limit, shadow_mode} (docs/envoy.md maps
// the names), labelled by domain and by descriptor, the configured
// descriptor path as envoyproxy/ratelimit writes it ("key_value.key").
// Register it once.
func (s *Service) Collector() prometheus.Collector {
	labels := []string{"domain", "descriptor"}
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, labels, nil) }
	return &collector{t: &s.stats,
		total:  d("weir_envoy_hits_total", "Hits (hits_addend) asked of each configured envoy descriptor: envoyproxy/ratelimit's total_hits."),
		within: d("weir_envoy_within_limit_hits_total", "Hits of the answers within the limit: envoyproxy/ratelimit's within_limit."),
		over:   d("weir_envoy_over_limit_hits_total", "Hits over the limit (shadow mode included): envoyproxy/ratelimit's over_limit."),
		near:   d("weir_envoy_near_limit_hits_total", "Hits that brought the tokens used above NEAR_LIMIT_RATIO (0.8) of the limit, up to the limit: envoyproxy/ratelimit's near_limit."),
		shadow: d("weir_envoy_shadow_mode_hits_total", "Hits over the limit of a shadow_mode descriptor, answered OK: envoyproxy/ratelimit's shadow_mode."),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.total, c.within, c.over, c.near, c.shadow} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	c.t.mu.Lock()
	defer c.t.mu.Unlock()
	for k, s := range c.t.m {
		for _, m := range []struct {
			d *prometheus.Desc
			v *atomic.Uint64
		}{{c.total, &s.total}, {c.within, &s.within}, {c.over, &s.over}, {c.near, &s.near}, {c.shadow, &s.shadow}} {
			ch <- prometheus.MustNewConstMetric(m.d, prometheus.CounterValue, float64(m.v.Load()), k.domain, k.descriptor)
		}
	}
}

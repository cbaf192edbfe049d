package rls

import (
	"math"
	"sync"
	"sync/atomic"
	"unicode/utf8"

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

// DefaultValueSeries is the number of distinct stats names a configured
// descriptor's limit may take from request values (value_to_metric,
// detailed_metric) unless WithValueSeries says otherwise.
const DefaultValueSeries = 100

// maxValueStatsKey is the longest stats name taken from request values;
// a longer one is counted under the configured path (an overflow).
const maxValueStatsKey = 256

// WithValueSeries bounds the stats names a limit with value_to_metric or
// detailed_metric takes from request values (envoyconf.Match.StatsKey):
// each configured descriptor gets at most n of them, the first n distinct
// names seen; later names, and names longer than 256 bytes or not UTF-8,
// are counted under the descriptor's configured path and in
// weir_envoy_value_series_overflow_total. n ≤ 0 takes no names from
// values. The default is DefaultValueSeries.
func WithValueSeries(n int) Option { return func(s *Service) { s.stats.cap = max(n, 0) } }

// statsTable holds every descriptor's counters ever configured, and the
// series named after request values, at most cap per configured
// descriptor: bounded by the configuration, never by request values alone.
type statsTable struct {
	mu     sync.Mutex
	m      map[statsKey]*descriptorStats
	values map[statsKey]*valueSeries // by configured descriptor
	cap    int
}

// valueSeries are the series one configured descriptor's limit counts
// under names taken from request values.
type valueSeries struct {
	domain   string
	mu       sync.RWMutex
	m        map[string]*descriptorStats
	overflow atomic.Uint64 // answers counted under the configured path for want of room
}

// limitStats are one served limit's counters: its configured path's, and
// its value series when the limit has envoyconf's ValueStats.
type limitStats struct {
	base       *descriptorStats
	configured string
	values     *valueSeries
	cap        int
}

// of is the counters of the answer whose stats name is key
// (envoyconf.Match.StatsKey): the configured path's unless key names a
// value series, created while the descriptor has fewer than the cap.
func (l *limitStats) of(key string) *descriptorStats {
	if l == nil {
		return nil
	}
	if l.values == nil || key == "" || key == l.configured {
		return l.base
	}
	v := l.values
	v.mu.RLock()
	st := v.m[key]
	v.mu.RUnlock()
	if st != nil {
		return st
	}
	if len(key) > maxValueStatsKey || !utf8.ValidString(key) {
		v.overflow.Add(1)
		return l.base
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if st = v.m[key]; st == nil {
		if len(v.m) >= l.cap {
			v.overflow.Add(1)
			return l.base
		}
		st = &descriptorStats{}
		v.m[key] = st
	}
	return st
}

// served is a configuration with its limits' counters, swapped whole.
type served struct {
	cfg   *envoyconf.Config
	stats map[*envoyconf.Limit]*limitStats
}

// serve resolves cfg's limits to their counters, creating the missing ones.
func (t *statsTable) serve(cfg *envoyconf.Config) *served {
	sv := &served{cfg: cfg, stats: map[*envoyconf.Limit]*limitStats{}}
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
		ls := &limitStats{base: st, configured: l.StatsKey, cap: t.cap}
		if l.ValueStats && t.cap > 0 {
			if t.values == nil {
				t.values = map[statsKey]*valueSeries{}
			}
			if ls.values = t.values[k]; ls.values == nil {
				ls.values = &valueSeries{domain: l.Domain, m: map[string]*descriptorStats{}}
				t.values[k] = ls.values
			}
		}
		sv.stats[l] = ls
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
	t                                           *statsTable
	total, within, over, near, shadow, overflow *prometheus.Desc
}

// Collector returns a Prometheus collector of the service's per-descriptor
// hit counters, the counterparts of envoyproxy/ratelimit's
// ratelimit.service.rate_limit.<domain>.<descriptor>.{total_hits,
// within_limit, over_limit, near_limit, shadow_mode} (docs/envoy.md maps
// the names), labelled by domain and by descriptor, the configured
// descriptor path as envoyproxy/ratelimit writes it ("key_value.key"), or
// for a limit with value_to_metric or detailed_metric the name
// envoyproxy/ratelimit gives the answer, with request values in it
// (envoyconf.Match.StatsKey; WithValueSeries bounds them). Register it
// once.
func (s *Service) Collector() prometheus.Collector {
	labels := []string{"domain", "descriptor"}
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, labels, nil) }
	return &collector{t: &s.stats,
		total:    d("weir_envoy_hits_total", "Hits (hits_addend) asked of each configured envoy descriptor: envoyproxy/ratelimit's total_hits."),
		within:   d("weir_envoy_within_limit_hits_total", "Hits of the answers within the limit: envoyproxy/ratelimit's within_limit."),
		over:     d("weir_envoy_over_limit_hits_total", "Hits over the limit (shadow mode included): envoyproxy/ratelimit's over_limit."),
		near:     d("weir_envoy_near_limit_hits_total", "Hits that brought the tokens used above NEAR_LIMIT_RATIO (0.8) of the limit, up to the limit: envoyproxy/ratelimit's near_limit."),
		shadow:   d("weir_envoy_shadow_mode_hits_total", "Hits over the limit of a shadow_mode descriptor, answered OK: envoyproxy/ratelimit's shadow_mode."),
		overflow: d("weir_envoy_value_series_overflow_total", "Answers of a value_to_metric or detailed_metric descriptor counted under its configured path: its series named after request values were at the cap (or the name was too long)."),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.total, c.within, c.over, c.near, c.shadow, c.overflow} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	c.t.mu.Lock()
	defer c.t.mu.Unlock()
	// A name taken from values may equal another descriptor's configured
	// path, or another limit's value name: as in envoyproxy/ratelimit,
	// whose counters are by name, such series are one, summed.
	sums := map[statsKey]*[5]uint64{}
	add := func(k statsKey, s *descriptorStats) {
		v := sums[k]
		if v == nil {
			v = new([5]uint64)
			sums[k] = v
		}
		for i, x := range []*atomic.Uint64{&s.total, &s.within, &s.over, &s.near, &s.shadow} {
			v[i] += x.Load()
		}
	}
	for k, s := range c.t.m {
		add(k, s)
	}
	for k, vs := range c.t.values {
		vs.mu.RLock()
		for name, s := range vs.m {
			add(statsKey{vs.domain, name}, s)
		}
		vs.mu.RUnlock()
		ch <- prometheus.MustNewConstMetric(c.overflow, prometheus.CounterValue, float64(vs.overflow.Load()), k.domain, k.descriptor)
	}
	for k, v := range sums {
		for i, d := range []*prometheus.Desc{c.total, c.within, c.over, c.near, c.shadow} {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v[i]), k.domain, k.descriptor)
		}
	}
}

package rls

import (
	"context"
	"errors"
	"math"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/envoyconf"
)

// HeaderMode says which response headers (response_headers_to_add) an
// answer carries.
type HeaderMode int

// The HeaderMode values.
const (
	// HeadersWeir, the default, adds weir's set: X-RateLimit-Limit,
	// X-RateLimit-Remaining, X-RateLimit-Reset, RateLimit-Policy,
	// RateLimit and Retry-After on a rejection.
	HeadersWeir HeaderMode = iota
	// HeadersNone adds none, as envoyproxy/ratelimit with
	// LIMIT_RESPONSE_HEADERS_ENABLED=false.
	HeadersNone
	// HeadersEnvoy adds envoyproxy/ratelimit's three, as with
	// LIMIT_RESPONSE_HEADERS_ENABLED=true: the limit, the remaining and
	// the seconds until the window resets of the descriptor closest to its
	// limit (the last one over it, when one is), under the names of
	// WithEnvoyHeaderNames (RateLimit-Limit, RateLimit-Remaining and
	// RateLimit-Reset by default).
	HeadersEnvoy
)

// WithHeaders sets the response headers the service adds; the default is
// HeadersWeir.
func WithHeaders(m HeaderMode) Option { return func(s *Service) { s.headers = m } }

// WithEnvoyHeaderNames sets the names HeadersEnvoy uses, as
// envoyproxy/ratelimit's LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER and
// LIMIT_RESET_HEADER; an empty name keeps the default.
func WithEnvoyHeaderNames(limit, remaining, reset string) Option {
	return func(s *Service) {
		for _, n := range []struct {
			dst *string
			v   string
		}{{&s.hLimit, limit}, {&s.hRemaining, remaining}, {&s.hReset, reset}} {
			if n.v != "" {
				*n.dst = n.v
			}
		}
	}
}

// WithGlobalShadow answers every call's overall code OK, whatever its
// descriptors' codes, as envoyproxy/ratelimit's SHADOW_MODE=true: the
// statuses still say OVER_LIMIT, and everything is counted as usual.
func WithGlobalShadow(on bool) Option { return func(s *Service) { s.globalShadow = on } }

// unitReset is envoyproxy/ratelimit's duration until reset of a unit's
// window at now: the unit's length in whole seconds minus now's seconds
// into it (windows aligned to the Unix epoch).
func unitReset(u envoyconf.Unit, now time.Time) *durationpb.Duration {
	sec := int64(u.Duration() / time.Second)
	if sec <= 0 {
		return nil
	}
	return &durationpb.Duration{Seconds: sec - now.Unix()%sec}
}

// envoyHeaders are envoyproxy/ratelimit's response headers for statuses:
// those of the status with the least remaining among the limited ones,
// or of the last one over its limit (over[i]: not shadow, not quota).
func (s *Service) envoyHeaders(statuses []*rlsv3.RateLimitResponse_DescriptorStatus, over []bool, now time.Time) []*corev3.HeaderValue {
	var pick *rlsv3.RateLimitResponse_DescriptorStatus
	least := uint32(math.MaxUint32)
	for i, st := range statuses {
		switch {
		case over[i]:
			pick, least = st, 0
		case st.CurrentLimit != nil && st.LimitRemaining < least:
			pick, least = st, st.LimitRemaining
		}
	}
	if pick == nil {
		return nil
	}
	reset := unitReset(envoyconf.Unit(pick.CurrentLimit.Unit), now)
	return []*corev3.HeaderValue{
		{Key: s.hLimit, Value: strconv.FormatUint(uint64(pick.CurrentLimit.RequestsPerUnit), 10)},
		{Key: s.hRemaining, Value: strconv.FormatUint(uint64(pick.LimitRemaining), 10)},
		{Key: s.hReset, Value: strconv.FormatInt(reset.GetSeconds(), 10)},
	}
}

// fidelityCheck is one descriptor's counter under envoyconf's Fidelity:
// the limit it is compared with, configured or sent as an override.
type fidelityCheck struct {
	i     int // descriptor index
	lim   *envoyconf.Limit
	limit *rlsv3.RateLimitResponse_RateLimit
	hits  int64
	stats string // envoyconf.Match.StatsKey
}

// fidelityLimits resolves each descriptor's limit as envoyproxy/ratelimit
// does: in a known domain an override Envoy sends stands for the
// descriptor's limit (matched or not, with no name, shadow or quota mode),
// else the matched one; unlimited ones answer OK with MaxUint32, and
// limits another matched limit replaces are left out. It returns the
// checks to charge, each against the counter of its unit.
func fidelityLimits(cfg *envoyconf.Config, req *rlsv3.RateLimitRequest, resp *rlsv3.RateLimitResponse) ([]fidelityCheck, []weir.KeyCheck) {
	n := len(req.Descriptors)
	limits := make([]*envoyconf.Limit, n)
	ids := make([]string, n)
	statsKeys := make([]string, n)
	overrides := make([]*rlsv3.RateLimitResponse_RateLimit, n)
	entries := make([]envoyconf.Entry, 0, 4)
	for i, d := range req.Descriptors {
		entries = entries[:0]
		for _, e := range d.GetEntries() {
			entries = append(entries, envoyconf.Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
		if o := d.GetLimit(); o != nil && cfg.HasDomain(req.Domain) {
			overrides[i] = &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: o.GetRequestsPerUnit(), Unit: rlsv3.RateLimitResponse_RateLimit_Unit(o.GetUnit())}
			ids[i] = envoyconf.Identity(entries)
		} else if m, ok := cfg.Match(req.Domain, entries); ok {
			limits[i], ids[i], statsKeys[i] = m.Limit, m.Identity, m.StatsKey
		}
	}
	replaced := envoyconf.Replaced(limits)
	var fcs []fidelityCheck
	var checks []weir.KeyCheck
	for i := range n {
		resp.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		fc := fidelityCheck{i: i, lim: limits[i], limit: overrides[i], hits: cost(req, req.Descriptors[i]), stats: statsKeys[i]}
		unit := envoyconf.Unit(0)
		switch {
		case fc.limit != nil:
			unit = envoyconf.Unit(fc.limit.Unit)
		case fc.lim == nil || replaced[i]:
			continue
		case fc.lim.Unlimited:
			resp.Statuses[i].LimitRemaining = math.MaxUint32
			continue
		default:
			fc.limit, unit = currentLimit(fc.lim), fc.lim.Unit
		}
		rule := cfg.CounterRule(unit)
		if rule == "" {
			continue // an override of an unknown unit: no counter
		}
		fcs = append(fcs, fc)
		checks = append(checks, weir.KeyCheck{Rule: rule, Key: envoyconf.CounterKey(req.Domain, ids[i]), Cost: fc.hits})
	}
	return fcs, checks
}

// shouldFidelity is ShouldRateLimit under envoyconf's Fidelity: every
// descriptor's hits are added to its counter, and the count after the
// addition is compared with its limit, as envoyproxy/ratelimit compares
// its Redis counter (over when count > limit; remaining limit − count, or
// 0 over the limit; shadow_mode and quota_mode answer OK over it).
func (s *Service) shouldFidelity(ctx context.Context, req *rlsv3.RateLimitRequest, sv *served) (*rlsv3.RateLimitResponse, error) {
	now := time.Now()
	n := len(req.Descriptors)
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)}
	over := make([]bool, n)
	fcs, checks := fidelityLimits(sv.cfg, req, resp)
	for j := range checks {
		checks[j].Key = s.identity(checks[j].Key)
	}
	if len(checks) == 0 {
		return s.finish(resp, nil, over, now), nil
	}
	dec, err := s.node.CheckKeys(ctx, checks)
	switch {
	case errors.Is(err, weir.ErrUnknownRule):
		return nil, status.Errorf(codes.FailedPrecondition, "rls: the node does not hold the configuration's rules: %v", err)
	case err != nil:
		return nil, status.Errorf(codes.Internal, "rls: %v", err)
	}
	for j, r := range dec.Results() {
		fc := fcs[j]
		st := resp.Statuses[fc.i]
		count := max(envoyconf.FidelityCounterLimit-r.Remaining, 0)
		rpu := int64(fc.limit.RequestsPerUnit)
		o := count > rpu || !r.Allowed
		st.CurrentLimit = fc.limit
		st.DurationUntilReset = durationpb.New(r.Reset)
		if !o {
			st.LimitRemaining = uint32(rpu - count)
		}
		shadow, quota := fc.lim != nil && fc.lim.Shadow, fc.lim != nil && fc.lim.Quota
		if st := sv.stats[fc.lim].of(fc.stats); st != nil {
			st.count(uint64(rpu), uint64(fc.hits), o, shadow, uint64(max(rpu-count, 0)))
		}
		switch {
		case !o || shadow:
		case quota:
			st.DurationUntilReset = nil
		default:
			over[fc.i] = true
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
	}
	if dec.Degraded {
		resp.DynamicMetadata = &structpb.Struct{Fields: map[string]*structpb.Value{"weir.degraded": structpb.NewBoolValue(true)}}
	}
	return s.finish(resp, &dec, over, now), nil
}

package rls

import (
	"math"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"

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

// blockedCost is the cost charged to lim's rule for hits: hits, or for a
// zero limit under Fidelity hits + 1 when hits > 0, so that its window of 1
// is over on every hit and a check (0) is over once a hit was counted
// (envoyconf.Limit.RuleID).
func blockedCost(lim *envoyconf.Limit, hits int64) int64 {
	if lim.Blocked && hits > 0 {
		return min(hits, maxCost-1) + 1
	}
	return hits
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

package envoyoracle

import (
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// TestSharedKeyClass: in fidelity mode, a difference on a counter whose
// Redis key (entries and window start) another unit's counter of the same
// descriptor charged, earlier or in the same request, is sharedKeyClass,
// headers included; the same difference on a key no other unit charged is
// not, and neither is one outside fidelity mode.
func TestSharedKeyClass(t *testing.T) {
	minute := time.Unix(1_800_000_000/60*60, 0) // a minute's first second
	later := minute.Add(5 * time.Second)
	perMinute := &pb.RateLimitResponse_RateLimit{RequestsPerUnit: 4, Unit: pb.RateLimitResponse_RateLimit_MINUTE}
	perSecond := &pb.RateLimitResponse_RateLimit{RequestsPerUnit: 2, Unit: pb.RateLimitResponse_RateLimit_SECOND}
	answer := func(code pb.RateLimitResponse_Code, limit *pb.RateLimitResponse_RateLimit, remaining uint32) *pb.RateLimitResponse {
		return &pb.RateLimitResponse{OverallCode: code, Statuses: []*pb.RateLimitResponse_DescriptorStatus{{Code: code, CurrentLimit: limit, LimitRemaining: remaining}}}
	}
	plain := rq("rl", 1, dsc(nil, nil, "category", "account"))
	overridden := rq("rl", 1, dsc(nil, override(2, typev3.RateLimitUnit_SECOND), "category", "account"))
	for _, tc := range []struct {
		name  string
		mode  weirMode
		first time.Time // when the per-minute counter was charged
		at    time.Time // when the per-second override is sent
		want  bool
	}{
		{"the same start", weirFidelity, minute, minute, true},
		{"other starts", weirFidelity, later, later, false},
		{"not fidelity", weirFixedWindow, minute, minute, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHistory(nil)
			h.record(plain, tc.first, tc.first, answer(pb.RateLimitResponse_OK, perMinute, 2), nil)
			ta := newTally()
			e := answer(pb.RateLimitResponse_OVER_LIMIT, perSecond, 0)
			w := answer(pb.RateLimitResponse_OK, perSecond, 1)
			ta.compare(t, string(tc.mode), overridden, tc.at, tc.at, false, e, nil, w, nil, h.view())
			if got := ta.classes[string(tc.mode)+": "+sharedKeyClass] > 0; got != tc.want {
				t.Errorf("%s: %v, want %v (classes %v)", sharedKeyClass, got, tc.want, ta.classes)
			}
		})
	}
	// The minute's own counter later in the minute, after the second's
	// charge at its start: the key is the same.
	h := newHistory(nil)
	h.record(overridden, minute, minute, answer(pb.RateLimitResponse_OK, perSecond, 1), nil)
	ta := newTally()
	ta.compare(t, string(weirFidelityX3), plain, later, later, false, answer(pb.RateLimitResponse_OK, perMinute, 1), nil,
		answer(pb.RateLimitResponse_OK, perMinute, 2), nil, h.view())
	if ta.classes[string(weirFidelityX3)+": "+sharedKeyClass] == 0 {
		t.Errorf("the minute's counter after a second's charge at its start: classes %v", ta.classes)
	}
}

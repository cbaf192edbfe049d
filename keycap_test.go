package weir_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/ops"
)

// TestKeyCapHotIdentity: an attacker rotating identities through a node at
// its key cap cannot get a throttled identity forgiven. A rule 5/15m burst
// 5, MaxKeys 5 000, 300 000 rotating identities (one request each)
// interleaved with a hot identity that tries 3 000 times, on a fake clock:
// the local store evicts the least indebted entry, so the hot identity,
// owing more than every rotating one, is never the victim and is admitted at
// most the reference plus one (docs/overshoot.md, the local key cap term).
// The reference is one exact bucket of the rule with no cap fed the hot
// identity's requests.
func TestKeyCapHotIdentity(t *testing.T) {
	const (
		rotating = 300_000
		hotTries = 3_000
		maxKeys  = 5_000
	)
	now := time.Unix(1_700_000_000, 0)
	reg := prometheus.NewRegistry()
	n, err := weir.New(weir.Config{Rules: parseRules(t, `
rules:
  - id: per-ip
    key: [ip]
    limit: 5
    window: 15m
    burst: 5
`), MaxKeys: maxKeys, Clock: func() time.Time { return now }, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ref, err := bucket.NewGCRA(5, 15*time.Minute, 5)
	if err != nil {
		t.Fatal(err)
	}
	var refTAT bucket.TAT
	ctx := context.Background()
	buf := make([]byte, 0, 32)
	hot, refHot := 0, 0
	every := rotating / hotTries
	for i := range rotating {
		buf = strconv.AppendUint(append(buf[:0], "10."...), uint64(i), 10)
		n.Allow(ctx, weir.Request{Method: "GET", Path: "/", ClientIP: string(buf)})
		now = now.Add(10 * time.Microsecond)
		if i%every == every-1 {
			if n.Allow(ctx, weir.Request{Method: "GET", Path: "/", ClientIP: "203.0.113.9"}).Allowed {
				hot++
			}
			if ref.Step(&refTAT, now.UnixNano(), 1).Allowed {
				refHot++
			}
			now = now.Add(10 * time.Microsecond)
		}
	}
	var live int64
	var g weir.StoreStats
	for _, s := range ops.Overview(n).Stores {
		live += s.Live
		if s.Name == "gcra" {
			g = s
		}
	}
	t.Logf("hot identity admitted %d of %d tries, reference %d; live keys %d, forgiven evictions %d owing %.0f s", hot, hotTries, refHot, live, g.EvictedForgiven, g.ForgivenSeconds)
	if refHot != 5 {
		t.Fatalf("reference admitted %d, want 5 (the run is shorter than one emission interval)", refHot)
	}
	if hot > refHot+1 {
		t.Errorf("hot identity admitted %d times, reference %d: the key cap forgave it", hot, refHot)
	}
	if live > maxKeys+bucket.DefaultShards {
		t.Errorf("%d live keys over the cap %d", live, maxKeys)
	}
	// Every forgiven key was a rotating one that spent one token: it owed at
	// most one emission interval, 180 s.
	if g.EvictedForgiven == 0 || g.ForgivenSeconds <= 0 || g.ForgivenSeconds > 180*float64(g.EvictedForgiven) {
		t.Errorf("forgiven %d evictions owing %.0f s: want some, each at most 180 s", g.EvictedForgiven, g.ForgivenSeconds)
	}
	if got := gatherValue(t, reg, "weir_keys_forgiven_seconds_total", map[string]string{"store": "gcra"}); got != g.ForgivenSeconds {
		t.Errorf("weir_keys_forgiven_seconds_total{store=gcra} = %v, want %v", got, g.ForgivenSeconds)
	}
}

package region

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestKeyCap runs more identities than a small key cap holds, so that the
// coordinators evict, forgiven buckets included, and asserts the envelope
// with each identity's key cap term (the key cap row of docs/overshoot.md's
// fault terms), the derived bound on the debt forgiven, and that the term is
// needed: without it the worst identity's excess is above S.
func TestKeyCap(t *testing.T) {
	// Every identity keeps entries (no blind spend): the cap has entries
	// to evict.
	cfg := Config{Nodes: 3, Traffic: TrafficZipf, IDs: 2000, Rate: 30000, KeyCap: 100, TrackAll: true, Duration: 4 * time.Second, Seed: 1}
	r, err := Run(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	r.Summary(&out)
	st := r.Coord
	if !r.OK() {
		t.Fatalf("key cap run broke a bound:\n%s", out.String())
	}
	if st.EvictedForgiven == 0 || st.EvictedIdle == 0 {
		t.Fatalf("no forgiven or idle eviction (%+v):\n%s", st, out.String())
	}
	if float64(st.ForgivenTokens) > r.KeyCapDerived {
		t.Fatalf("forgiven %d tokens, above the derived (B + S) per eviction + s per view: %.0f", st.ForgivenTokens, r.KeyCapDerived)
	}
	if r.ExcessAccounted > r.BoundAccounted || r.ExcessClean > float64(r.S) {
		t.Fatalf("excess beyond the key cap term %.2f (clean %.2f) above %.2f", r.ExcessAccounted, r.ExcessClean, r.BoundAccounted)
	}
	if r.ExcessRaw <= float64(r.S) || r.ExcessRaw > float64(r.S)+r.RawTerm {
		t.Fatalf("excess without the term %.2f of %s: want above S = %d (the evictions show) and within S + its term %.0f",
			r.ExcessRaw, r.RawID, r.S, r.RawTerm)
	}
	if r.Degraded != 0 || st.OverCap != 0 {
		t.Fatalf("%d degraded decisions, %d entries over the cap", r.Degraded, st.OverCap)
	}
	if !strings.Contains(out.String(), "key cap 100 per rule per node") {
		t.Fatalf("the summary does not report the key cap:\n%s", out.String())
	}
	if !strings.Contains(r.Config.Flags(), "-keycap 100") {
		t.Fatalf("Flags() drops the key cap: %s", r.Config.Flags())
	}
}

// TestKeyCapGrid: a sweep's keycap dimension reaches the runs.
func TestKeyCapGrid(t *testing.T) {
	g, err := ParseGrid("nodes=3;traffic=zipf;keycap=0,100")
	if err != nil {
		t.Fatal(err)
	}
	cs := g.Configs(Config{})
	if len(cs) != 2 || cs[0].KeyCap != 0 || cs[1].KeyCap != 100 {
		t.Fatalf("configs %+v", cs)
	}
	if _, err := ParseGrid("keycap=-1"); err == nil {
		t.Fatal("keycap=-1 accepted")
	}
}

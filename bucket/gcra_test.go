package bucket

import (
	"math"
	"math/big"
	"testing"
	"time"

	"pgregory.net/rapid"
)

const ms = int64(time.Millisecond)

// fataler is what testing.TB and *rapid.T share.
type fataler interface{ Fatal(args ...any) }

func mustGCRA(t fataler, limit int64, window time.Duration, burst int64) GCRA {
	g, err := NewGCRA(limit, window, burst)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestNewGCRAErrors(t *testing.T) {
	for _, tc := range []struct {
		name         string
		limit, burst int64
		window       time.Duration
		want         string
	}{
		{"limit0", 0, 1, time.Second, "limit"},
		{"window0", 1, 1, 0, "window"},
		{"limitAboveNs", 2, 1, 1, "limit"},
		{"burst0", 1, 0, time.Second, "burst"},
		{"burstOverflow", 1, math.MaxInt64 / 2, time.Hour, "burst"},
	} {
		_, err := NewGCRA(tc.limit, tc.window, tc.burst)
		if err == nil || !contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want mention of %q", tc.name, err, tc.want)
		}
	}
	g := mustGCRA(t, 3, 10, 1) // T = ceil(10/3) = 4 ns: rounds up, never over-admits
	if g.Interval() != 4 || g.Burst() != 1 {
		t.Errorf("interval %v burst %d", g.Interval(), g.Burst())
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// The requirement: "a client at 100/min with burst 20 may send 20 at
// once, then one every 600 ms".
func TestGCRA100PerMinuteBurst20(t *testing.T) {
	g := mustGCRA(t, 100, time.Minute, 20)
	var s TAT
	now := int64(1_000_000_000_000)
	for i := 0; i < 20; i++ {
		if d := g.Step(&s, now, 1); !d.Allowed || d.Remaining != int64(19-i) {
			t.Fatalf("request %d: %+v", i, d)
		}
	}
	d := g.Step(&s, now, 1)
	if d.Allowed || d.RetryAfter != 600*time.Millisecond || d.Remaining != 0 {
		t.Fatalf("21st: %+v", d)
	}
	for k := 1; k <= 50; k++ {
		at := now + int64(k)*600*ms
		if d := g.Step(&s, at-1, 1); d.Allowed || d.RetryAfter != 1 {
			t.Fatalf("k=%d 1ns early: %+v", k, d)
		}
		if d := g.Step(&s, at, 1); !d.Allowed || d.Remaining != 0 {
			t.Fatalf("k=%d on time: %+v", k, d)
		}
		if d := g.Step(&s, at, 1); d.Allowed {
			t.Fatalf("k=%d second at once: %+v", k, d)
		}
	}
}

func TestGCRATable(t *testing.T) {
	g := mustGCRA(t, 10, time.Second, 5) // T = 100 ms, tau = 500 ms
	const t0 = int64(10 * time.Second)
	type step struct {
		now, cost int64
		want      Decision
		tat       TAT
	}
	for _, tc := range []struct {
		name  string
		start TAT
		steps []step
	}{
		{"peekFresh", 0, []step{{t0, 0, Decision{Allowed: true, Limit: 5, Remaining: 5}, 0}}},
		{"costEqualsBurst", 0, []step{
			{t0, 5, Decision{Allowed: true, Limit: 5, Remaining: 0, Reset: 500 * time.Millisecond}, TAT(t0 + 500*ms)},
			{t0, 1, Decision{Limit: 5, Reset: 500 * time.Millisecond, RetryAfter: 100 * time.Millisecond}, TAT(t0 + 500*ms)},
		}},
		{"costAboveBurst", 0, []step{{t0, 6, Decision{Limit: 5, Remaining: 5, RetryAfter: Never}, 0}}},
		{"negativeCostIsPeek", 0, []step{{t0, -3, Decision{Allowed: true, Limit: 5, Remaining: 5}, 0}}},
		{"debtPeekRejects", TAT(t0 + 2000*ms), []step{
			{t0, 0, Decision{Limit: 5, Reset: 2 * time.Second, RetryAfter: 1500 * time.Millisecond}, TAT(t0 + 2000*ms)},
			{t0 + 1500*ms, 0, Decision{Allowed: true, Limit: 5, Reset: 500 * time.Millisecond}, TAT(t0 + 2000*ms)},
			{t0 + 1600*ms, 1, Decision{Allowed: true, Limit: 5, Reset: 500 * time.Millisecond}, TAT(t0 + 2100*ms)},
		}},
		{"hugeGap", TAT(t0), []step{{t0 + int64(1000*time.Hour), 2, Decision{Allowed: true, Limit: 5, Remaining: 3, Reset: 200 * time.Millisecond}, TAT(t0 + int64(1000*time.Hour) + 200*ms)}}},
		{"clockBackwards", TAT(t0 + 300*ms), []step{
			{t0 - 1000*ms, 1, Decision{Limit: 5, Reset: 1300 * time.Millisecond, RetryAfter: 900 * time.Millisecond}, TAT(t0 + 300*ms)},
		}},
		{"partial", TAT(t0 + 250*ms), []step{{t0, 2, Decision{Allowed: true, Limit: 5, Remaining: 0, Reset: 450 * time.Millisecond}, TAT(t0 + 450*ms)}}},
	} {
		s := tc.start
		for i, st := range tc.steps {
			if p := g.Peek(s, st.now); st.cost == 0 && p != st.want {
				t.Errorf("%s step %d: Peek %+v, want %+v", tc.name, i, p, st.want)
			}
			d := g.Step(&s, st.now, st.cost)
			if d != st.want || s != st.tat {
				t.Errorf("%s step %d: got %+v tat %d, want %+v tat %d", tc.name, i, d, s, st.want, st.tat)
			}
		}
	}
}

func TestGCRAChargeDebt(t *testing.T) {
	g := mustGCRA(t, 10, time.Second, 5)
	var s TAT
	now := int64(time.Second)
	g.Charge(&s, now, 50) // 5 s of debt beyond a full bucket's worth
	if s != TAT(now+5000*ms) {
		t.Fatalf("tat %d", s)
	}
	if d := g.Step(&s, now+4000*ms, 1); d.Allowed || d.RetryAfter != 600*time.Millisecond {
		t.Fatalf("in debt: %+v", d)
	}
	g.Charge(&s, now, math.MaxInt64) // never capped, saturates instead of wrapping
	if s != math.MaxInt64 {
		t.Fatalf("saturate: %d", s)
	}
	if d := g.Step(&s, now, 1); d.Allowed {
		t.Fatalf("saturated debt admitted: %+v", d)
	}
	g.Charge(&s, now, 0)
	g.Charge(&s, now, -1)
	if s != math.MaxInt64 {
		t.Fatal("cost <= 0 changed state")
	}
}

// arrival is one generated request.
type arrival struct {
	gap  int64 // ns after the previous one
	cost int64
}

// TestGCRAUpperBoundProperty checks the reference envelope of
// docs/overshoot.md: over any interval between two admissions, at most
// B + Δ/T tokens pass (in integers: Σc·T <= B·T + Δ).
func TestGCRAUpperBoundProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		limit := rapid.Int64Range(1, 50).Draw(rt, "limit")
		burst := rapid.Int64Range(1, 20).Draw(rt, "burst")
		g := mustGCRA(rt, limit, time.Second, burst)
		T := int64(g.Interval())
		n := rapid.IntRange(1, 200).Draw(rt, "n")
		var s TAT
		now := int64(1)
		var at, cs []int64
		for i := 0; i < n; i++ {
			now += rapid.Int64Range(0, 3*T).Draw(rt, "gap")
			c := rapid.Int64Range(0, burst+1).Draw(rt, "cost")
			if d := g.Step(&s, now, c); d.Allowed && c > 0 {
				at, cs = append(at, now), append(cs, c)
			}
		}
		for i := range at {
			var sum int64
			for j := i; j < len(at); j++ {
				sum += cs[j]
				if sum*T > burst*T+(at[j]-at[i]) {
					rt.Fatalf("admitted %d in [%d,%d]: above B + Δ/T", sum, at[i], at[j])
				}
			}
		}
	})
}

// TestGCRALowerBoundProperty: a client that retries exactly when RetryAfter
// says gets at least Δ/T − c over any interval, and B + Δ/T − c from a full
// bucket (docs/overshoot.md, the envelope's lower bound with S = 0).
func TestGCRALowerBoundProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		limit := rapid.Int64Range(1, 50).Draw(rt, "limit")
		burst := rapid.Int64Range(1, 20).Draw(rt, "burst")
		g := mustGCRA(rt, limit, time.Second, burst)
		T := int64(g.Interval())
		var s TAT
		t0 := rapid.Int64Range(1, 1e12).Draw(rt, "t0")
		now := t0
		type ev struct{ at, admitted, pending int64 } // cumulative tokens after the decision at at
		var evs []ev
		var total int64
		c := rapid.Int64Range(1, burst).Draw(rt, "cost")
		for i := 0; i < 300; i++ {
			d := g.Step(&s, now, c)
			if d.Allowed {
				total += c
				evs = append(evs, ev{now, total, 0})
				c = rapid.Int64Range(1, burst).Draw(rt, "cost")
				continue // saturating: the next one goes at once
			}
			evs = append(evs, ev{now, total, c})
			now += int64(d.RetryAfter)
		}
		cmax := burst
		for j, e := range evs {
			// From full: Σc >= B + (t − t0)/T − c.
			if e.admitted*T < burst*T+(e.at-t0)-cmax*T {
				rt.Fatalf("from full at %d: %d admitted", e.at-t0, e.admitted)
			}
			for i := 0; i < j; i++ {
				got := e.admitted - evs[i].admitted // admitted in (a, b]
				if got*T < (e.at-evs[i].at)-cmax*T {
					rt.Fatalf("(%d,%d]: %d admitted, below Δ/T − c", evs[i].at, e.at, got)
				}
			}
		}
	})
}

// refBucket is the "dumb" reference: a token bucket with refill, written
// plainly. It counts tokens as exact rationals; with float64 it would
// disagree at exact boundaries (tokens == cost after refilling by a
// fraction such as 1/3 rounds either way), which is rounding, not a bug.
type refBucket struct {
	tokens    *big.Rat
	last      int64
	burst     int64
	interval  int64
	started   bool
	remaining int64
}

func (r *refBucket) allow(now, cost int64) (bool, time.Duration) {
	if !r.started {
		r.tokens, r.last, r.started = big.NewRat(r.burst, 1), now, true
	}
	refill := big.NewRat(now-r.last, r.interval)
	r.tokens.Add(r.tokens, refill)
	if r.tokens.Cmp(big.NewRat(r.burst, 1)) > 0 {
		r.tokens.SetInt64(r.burst)
	}
	r.last = now
	c := big.NewRat(cost, 1)
	if r.tokens.Cmp(c) >= 0 {
		r.tokens.Sub(r.tokens, c)
		r.remaining = new(big.Int).Quo(r.tokens.Num(), r.tokens.Denom()).Int64()
		return true, 0
	}
	r.remaining = new(big.Int).Quo(r.tokens.Num(), r.tokens.Denom()).Int64()
	if cost > r.burst {
		return false, Never
	}
	need := new(big.Rat).Sub(c, r.tokens)
	need.Mul(need, big.NewRat(r.interval, 1)) // ns; integral since tokens·T is
	return false, time.Duration(need.Num().Int64())
}

// TestGCRADifferential checks GCRA against refBucket over many random
// sequences: every decision, RetryAfter and Remaining agree exactly.
func TestGCRADifferential(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		limit := rapid.Int64Range(1, 1000).Draw(rt, "limit")
		window := time.Duration(rapid.Int64Range(limit, 10*int64(time.Second)).Draw(rt, "window"))
		burst := rapid.Int64Range(1, 30).Draw(rt, "burst")
		g := mustGCRA(rt, limit, window, burst)
		ref := &refBucket{burst: burst, interval: int64(g.Interval())}
		var s TAT
		now := rapid.Int64Range(1, 1e15).Draw(rt, "t0")
		for i := 0; i < 100; i++ {
			now += rapid.Int64Range(0, 2*int64(g.Interval())).Draw(rt, "gap")
			c := rapid.Int64Range(0, burst+2).Draw(rt, "cost")
			d := g.Step(&s, now, c)
			ok, retry := ref.allow(now, c)
			if d.Allowed != ok || d.RetryAfter != retry || d.Remaining != ref.remaining {
				rt.Fatalf("step %d now %d cost %d: gcra %+v, ref ok=%v retry=%v remaining=%d", i, now, c, d, ok, retry, ref.remaining)
			}
		}
	})
}

// TestGCRALongRunning is the x/time/rate TestLongRunningQPS analogue,
// through the Store with a fake clock: admitted <= burst + rate·elapsed, and
// a steady client at twice the rate gets nearly all of rate·elapsed.
func TestGCRALongRunning(t *testing.T) {
	g := mustGCRA(t, 1000, time.Second, 10) // T = 1 ms
	st, err := NewStore[TAT](StoreConfig{Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	const keys = 8
	start := int64(time.Hour)
	admitted := make([]int64, keys)
	now := start
	for i := 0; i < 200_000; i++ {
		now += int64(500 * time.Microsecond / keys)
		k := uint64(i % keys)
		if st.Apply(k, now, &g, 1).Allowed {
			admitted[k]++
		}
	}
	elapsed := now - start
	ideal := 10 + elapsed/int64(time.Millisecond)
	for k, a := range admitted {
		if a > ideal || a < ideal*99/100 {
			t.Errorf("key %d admitted %d, ideal %d", k, a, ideal)
		}
	}
}

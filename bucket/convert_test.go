package bucket

import (
	"math"
	"math/big"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// A raised limit admits what a bucket of the new rule holding the same
// tokens admits: 5/min burst 5 with one token spent, raised a second later
// to 50/min burst 5, admits the next 4 requests.
func TestConvertRaisedLimitKeepsTokens(t *testing.T) {
	old, _ := NewGCRA(5, time.Minute, 5)
	raised, _ := NewGCRA(50, time.Minute, 5)
	var s TAT
	if !old.Step(&s, 0, 1).Allowed {
		t.Fatal("first request rejected")
	}
	now := int64(time.Second)
	s = raised.Convert(old, s, now)
	for i := 0; i < 4; i++ {
		if d := raised.Step(&s, now, 1); !d.Allowed {
			t.Fatalf("request %d after the raise rejected: %+v", i+1, d)
		}
	}
}

func TestConvertEdges(t *testing.T) {
	a, _ := NewGCRA(10, time.Second, 10) // T = 100ms
	b, _ := NewGCRA(10, time.Second, 4)  // lowered burst
	c, _ := NewGCRA(20, time.Second, 20) // raised limit and burst
	now := int64(time.Hour)
	if got := b.Convert(a, TAT(now-5), now); got != TAT(now-5) {
		t.Errorf("a full bucket changed: %d", got)
	}
	// 3 tokens spent of 10, lowered to burst 4: 7 held, clamped to 4: full.
	if got := b.Convert(a, TAT(now+3*100e6), now); got != TAT(now) {
		t.Errorf("3 spent of 10 into burst 4: tat %d, want now", int64(got)-now)
	}
	// 8 spent of 10 (2 held) into burst 4: 2 held, 2 spent: 200ms.
	if got := b.Convert(a, TAT(now+8*100e6), now); int64(got)-now != 200e6 {
		t.Errorf("8 spent of 10 into burst 4: used %d, want 200ms", int64(got)-now)
	}
	// 8 spent of 10 raised to burst 20 at 50ms per token: 8 still spent.
	if got := c.Convert(a, TAT(now+8*100e6), now); int64(got)-now != 400e6 {
		t.Errorf("8 spent into burst 20: used %d, want 400ms", int64(got)-now)
	}
	// Debt carries over as debt.
	if got := c.Convert(a, TAT(now+30*100e6), now); int64(got)-now != 30*50e6 {
		t.Errorf("debt of 20: used %d, want 1.5s", int64(got)-now)
	}
	huge, _ := NewGCRA(1, 1000*time.Hour, 1)
	tiny, _ := NewGCRA(1e9, time.Second, 1)
	if got := huge.Convert(tiny, TAT(math.MaxInt64/2), 0); got != TAT(math.MaxInt64) {
		t.Errorf("overflow: %d, want saturation", got)
	}
}

// Convert against the definition in exact rationals: the tokens held after
// the conversion are x' = min(x + max(0, B'−B), B') rounded down to the
// nanosecond grid (never more).
func TestConvertMatchesRationalDefinition(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		mk := func(name string) GCRA {
			limit := rapid.Int64Range(1, 1000).Draw(t, name+"limit")
			window := time.Duration(rapid.Int64Range(1, 1e12).Draw(t, name+"window"))
			burst := rapid.Int64Range(1, 1000).Draw(t, name+"burst")
			if limit > int64(window) {
				window = time.Duration(limit)
			}
			g, err := NewGCRA(limit, window, burst)
			if err != nil {
				t.Skip(err)
			}
			return g
		}
		old, nw := mk("old"), mk("new")
		now := rapid.Int64Range(0, 1e15).Draw(t, "now")
		used := rapid.Int64Range(-1e12, 4*old.tau).Draw(t, "used")
		got := nw.Convert(old, TAT(now+used), now)
		if used <= 0 {
			if got != TAT(now+used) {
				t.Fatalf("full bucket changed")
			}
			return
		}
		r := func(n int64) *big.Rat { return new(big.Rat).SetInt64(n) }
		x := new(big.Rat).Sub(r(old.burst), new(big.Rat).Quo(r(used), r(old.t)))
		if nw.burst > old.burst {
			x.Add(x, r(nw.burst-old.burst))
		}
		if x.Cmp(r(nw.burst)) > 0 {
			x = r(nw.burst)
		}
		want := new(big.Rat).Mul(new(big.Rat).Sub(r(nw.burst), x), r(nw.t)) // exact used'
		gotUsed := r(int64(got) - now)
		if gotUsed.Cmp(want) < 0 {
			t.Fatalf("converted bucket holds more than x': used %v < %v", gotUsed, want)
		}
		if new(big.Rat).Sub(gotUsed, want).Cmp(r(1)) >= 0 {
			t.Fatalf("converted bucket rounded by a nanosecond or more: used %v, want %v", gotUsed, want)
		}
	})
}

package global

import (
	"math"
	"time"

	"github.com/weir-dev/weir/bucket"
)

// regionBucket is a region's enforcement of one global identity: a GCRA
// bucket at the share its Holder gives (rate share ÷ W, burst the share's
// burst), plus the in-region slack S_r = ⌊a·share⌋ that stands for the
// region's cluster (see the package comment).
//
// Tokens carry over a change of share: on a shrink they are clamped to the
// new burst, on a grow they stay (capacity, not tokens), and debt (negative
// tokens) is kept either way. At share 0 there is no bucket and tok0 keeps
// the tokens (0, or the debt).
type regionBucket struct {
	share, burst int64
	fallback     bool
	g            bucket.GCRA
	tat          int64
	tok0         float64
	slack        int64
	unconf       int64 // slack spend not yet charged to the bucket
}

// tokens returns the bucket's tokens at now (negative: debt).
func (b *regionBucket) tokens(now int64) float64 {
	if b.share <= 0 {
		return b.tok0
	}
	used := max(b.tat-now, 0)
	return float64(b.burst) - float64(used)/float64(b.g.Interval())
}

// set enforces share and burst from now on. It reports whether they
// changed.
func (b *regionBucket) set(share, burst int64, fallback bool, now int64, w time.Duration, a float64) bool {
	b.fallback = fallback
	if share == b.share && burst == b.burst {
		return false
	}
	tok := b.tokens(now)
	b.share, b.burst = share, burst
	b.slack = int64(a * float64(share))
	if share <= 0 {
		b.tok0 = min(tok, 0)
		return true
	}
	g, err := bucket.NewGCRA(share, w, max(burst, 1))
	if err != nil {
		panic(err) // Config.Validate keeps share ≤ W in ns and burst ≥ cost ≥ 1
	}
	b.g = g
	tok = min(tok, float64(burst))
	// Round the time used up, so the new bucket never holds more tokens
	// than the old one did.
	used := math.Ceil((float64(burst) - tok) * float64(g.Interval()))
	b.tat = now + int64(used)
	return true
}

// step decides a request of cost tokens at now on the bucket alone.
func (b *regionBucket) step(now, cost int64) bool {
	if b.share <= 0 {
		return false
	}
	return b.g.Step((*bucket.TAT)(&b.tat), now, cost).Allowed
}

// slackOK reports whether cost more tokens fit in the slack: the spend not
// yet charged plus cost within S_r, and the bucket not in debt (a node may
// not reuse acknowledged slack before the owner's bucket can pay again).
func (b *regionBucket) slackOK(now, cost int64) bool {
	return b.share > 0 && b.unconf+cost <= b.slack && b.tat-now <= int64(b.burst)*int64(b.g.Interval())
}

// charge charges the unconfirmed slack spend to the bucket (it may go into
// debt), as the owner does on a sync.
func (b *regionBucket) charge(now int64) {
	if b.unconf == 0 {
		return
	}
	if b.share > 0 {
		b.g.Charge((*bucket.TAT)(&b.tat), now, b.unconf)
	} else {
		b.tok0 -= float64(b.unconf)
	}
	b.unconf = 0
}

// debt is how long the bucket needs to be full again at its share (ns, ≤ 0
// when full): what an acknowledgement carries.
func (b *regionBucket) debt(now int64) int64 {
	if b.share <= 0 {
		return 0
	}
	return b.tat - now
}

// owed is D + U: the debt beyond an empty bucket plus the unconfirmed
// spend, in tokens.
func (b *regionBucket) owed(now int64) float64 {
	return max(-b.tokens(now), 0) + float64(b.unconf)
}

package weir

import (
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/internal/prefetch"
)

// Recent per-identity counts: a count-min sketch of allowed and rejected
// decisions, keyed by the (rule, identity) key the decision path already
// computed, in two alternating periods.
//
// Why a count-min and not an LRU of identities: it costs a fixed 512 KiB
// per node whatever the number of identities, never allocates, and takes no
// lock on the decision path (two atomic adds per rule verdict); an LRU would
// need a lock or a sharded map and an allocation per new identity. The price
// is that estimates never undercount but may overcount when keys share
// cells: the error is at most about 2/recentWidth of the period's decisions
// with probability 1 − (1/2)^recentDepth per estimate (for 1 M decisions in a
// period, a few hundred). For an operator's "is this customer being
// throttled and how much" that is enough; exact totals are the per-rule
// counters.
//
// Periods: counts go to the slot of the current period (recentPeriod long);
// an estimate sums the current and the previous one, so it covers between
// one and two periods back. The first decision of a new period clears its
// slot (a 256 KiB clear, once a period); a decision counted by another core
// during that clear may be lost: the counts are advisory.
const (
	recentPeriod = 30 * time.Second
	recentDepth  = 2
	recentWidth  = 1 << 14 // cells per row
	// Each cell packs two counters: allowed in the low 32 bits, rejected
	// in the high 32 (a period would need 4 G decisions of one cell to
	// carry over).
	recentRejected = uint64(1) << 32
)

type recentSlot struct {
	period atomic.Int64
	cells  [recentDepth * recentWidth]atomic.Uint64
}

// recentCounts is the sketch. The zero value is ready to use.
type recentCounts struct {
	// started is when the node began counting (unix ns): the counts reach
	// back no further.
	started int64
	slots   [2]recentSlot
	// cur is the slot the latest period claimed (its period's parity), for
	// prefetch: set when a period takes its slot over, read without order.
	cur atomic.Int32
}

// cells returns the cell indices of key, one per row.
func recentCells(key uint64) (a, b int) {
	h := bucket.Splitmix64(key)
	return int(h & (recentWidth - 1)), recentWidth + int((h>>32)&(recentWidth-1))
}

// add counts one verdict for key at now: allowed or rejected.
func (rc *recentCounts) add(key uint64, now int64, rejected bool) {
	p := now / int64(recentPeriod)
	s := &rc.slots[p&1]
	if old := s.period.Load(); old != p {
		if old > p {
			return // a later period owns the slot: the clock stepped back
		}
		if s.period.CompareAndSwap(old, p) {
			for i := range s.cells {
				s.cells[i].Store(0)
			}
			rc.cur.Store(int32(p & 1))
		}
	}
	d := uint64(1)
	if rejected {
		d = recentRejected
	}
	a, b := recentCells(key)
	s.cells[a].Add(d)
	s.cells[b].Add(d)
}

// prefetch starts loading key's cells in the current period's slot into the
// CPU's cache, so that add, after the decision, finds them there: a hint
// that changes nothing (the slot may have turned over in between; add is
// right either way).
func (rc *recentCounts) prefetch(key uint64) {
	s := &rc.slots[rc.cur.Load()&1]
	a, b := recentCells(key)
	prefetch.Line(uintptr(unsafe.Pointer(&s.cells[a])))
	prefetch.Line(uintptr(unsafe.Pointer(&s.cells[b])))
}

// estimate returns key's allowed and rejected counts over the current and
// the previous period at now, and how far back that reaches: to the
// previous period's start, or to the node's start when that is later.
func (rc *recentCounts) estimate(key uint64, now int64) (allowed, rejected uint64, since time.Duration) {
	p := now / int64(recentPeriod)
	a, b := recentCells(key)
	for i := range rc.slots {
		s := &rc.slots[i]
		if sp := s.period.Load(); sp != p && sp != p-1 {
			continue
		}
		ca, cb := s.cells[a].Load(), s.cells[b].Load()
		allowed += min(ca&(recentRejected-1), cb&(recentRejected-1))
		rejected += min(ca>>32, cb>>32)
	}
	since = time.Duration(now - max((p-1)*int64(recentPeriod), rc.started)) // the previous period's start
	return allowed, rejected, since
}

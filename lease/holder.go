package lease

// Holder is a region's side of one lease on a (rule, identity): the share
// the region enforces at a given time. It is a value with no clock: times
// are the region's own (unix ns), and a lease's lifetime is counted from
// when the region sent the report that brought it, so no time of the
// leader's is ever compared with the region's clock.
//
// A Holder starts with no lease (Granted is false): the region waits for its
// first lease, or applies the rule's fallback, and the leader counts it as
// holding nothing. A granted lease is enforced until its lifetime, less the
// skew margin, has passed; after that the region falls back to min(safe,
// the last share it received) until a new grant arrives. Grants of an older epoch than the one held are ignored (epoch
// fencing): a late reply can never bring back a larger share.
type Holder struct {
	safe, safeBurst int64
	share, burst    int64
	epoch           uint64
	until           int64 // region time the lease ends
	skew            int64
	// capped: the region gave capacity back (Regional); it enforces at
	// most cap, with burst capBurst, whatever lease it holds.
	capped        bool
	cap, capBurst int64
}

// NewHolder returns the holder, with no lease yet, of a region's share of
// rule r among regions regions, with the machine's skew margin (ns).
func NewHolder(r Rule, regions int, skew int64) Holder {
	safe := r.Limit / int64(max(regions, 1))
	return Holder{safe: safe, safeBurst: burst(r, safe), skew: skew}
}

// SetRule follows a change of rule r's limit or burst (among regions
// regions), keeping the lease held: the leader counts the region at that
// share until it acknowledges a new one or the lease expires, so enforcing
// it meanwhile is within the invariant. The safe share only ever goes down
// here: after a raised limit the leader may already have clamped an
// expired lease's hold to the old safe share, and a fallback above that
// would be counted nowhere (a holder made after the change starts from the
// new safe share).
func (h *Holder) SetRule(r Rule, regions int) {
	if safe := r.Limit / int64(max(regions, 1)); safe < h.safe {
		h.safe = safe
	}
	h.safeBurst = burst(r, h.safe)
}

// Granted reports whether the region has received a lease.
func (h *Holder) Granted() bool { return h.epoch != 0 }

// Accept takes a grant that answers a report sent at sentAt (region time).
// It returns false, and changes nothing, for a grant of an older epoch than
// the lease held, or for no lease (epoch 0).
func (h *Holder) Accept(sentAt int64, g Grant) bool {
	if g.Epoch == 0 || g.Epoch < h.epoch {
		return false
	}
	until := sentAt + g.Lifetime - h.skew
	if g.Epoch == h.epoch {
		// A renewal of the lease held.
		h.until = max(h.until, until)
		return true
	}
	h.epoch, h.share, h.burst, h.until = g.Epoch, g.Share, g.Burst, until
	return true
}

// Cap makes the holder enforce at most share (tokens per window, with
// burst b) from now on, whatever lease it holds or accepts, until Uncap: a
// region gives capacity back (ReportItem.Capped). A cap only lowers: a
// larger share than the cap in force changes nothing.
func (h *Holder) Cap(share, b int64) {
	if h.capped && share >= h.cap {
		return
	}
	h.capped, h.cap, h.capBurst = true, max(share, 0), b
}

// Uncap lifts the cap: the grant accepted last answers a report that
// carried it, so the leader counts what it grants.
func (h *Holder) Uncap() { h.capped = false }

// Capped returns the cap in force, if any.
func (h *Holder) Capped() (share int64, ok bool) { return h.cap, h.capped }

// Epoch returns the epoch of the lease held (0: none yet).
func (h *Holder) Epoch() uint64 { return h.epoch }

// At returns the share (tokens per window) and burst the region enforces at
// now, and whether that is the fallback because the lease has expired or
// none was received yet (share 0).
//
// Under a cap (Cap) both are at most the cap's.
func (h *Holder) At(now int64) (share, burst int64, fallback bool) {
	if h.epoch == 0 {
		return 0, 0, true
	}
	share, burst = h.share, h.burst
	if h.capped && h.cap < share {
		share, burst = h.cap, h.capBurst
	}
	if now < h.until {
		return share, burst, false
	}
	if share < h.safe {
		return share, burst, true
	}
	return h.safe, h.safeBurst, true
}

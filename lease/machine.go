package lease

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"
)

// This file is the lease group's replicated state: a pure, deterministic
// state machine. The Raft FSM's Apply (lease/raftgroup) decodes an entry
// and calls Replica.ApplyEntry, which calls Machine.Apply, nothing else; every time the machine uses comes in the
// command (the leader's clock when it proposed it), so every replica reaches
// the same state.
//
// The contract is docs/global.md. For one global
// (rule, identity) with limit L tokens per window, each region r holds a
// share of L. The leader keeps, per region, the largest share the region may
// be enforcing (hold) and when its lease expires, and commits only grants
// after which, at every instant,
//
//	Σᵣ termᵣ ≤ L,  termᵣ = holdᵣ                  while r's lease may be unexpired,
//	               termᵣ = min(safeᵣ, holdᵣ)       after it expired (r falls back),
//
// where safeᵣ = ⌊L ÷ regions⌋ and a region falls back to min(safe, the last
// share it received) ≤ min(safe, hold). That is the invariant
// Σᵣ max(unexpired shareᵣ, fallbackᵣ) ≤ L, with the leader's view of each
// term always at least what the region can really use:
//
//   - A region that never received a grant for a key holds nothing: its
//     first lease comes from the leader, and until it arrives the region
//     enforces its fallback, min(safe, last share received) = 0 (or the
//     rule's open/closed fallback). So the whole of L is the leader's to
//     hand out, and a region that sees a customer for the first time pays
//     one round trip to the leader for it. A region gives a key up only by
//     reporting demand 0 and acknowledging the share of 0 it gets back;
//     until then its last share counts.
//   - Epochs come from one counter of the machine, so they never repeat,
//     even for a key that was dropped and comes back.
//   - A grow raises hold at once (the region may use it as soon as it
//     arrives), and only by capacity that is free: L − Σ terms.
//   - A shrink lowers the granted share at once but hold only when the region
//     acknowledges the new epoch, and then only once its bucket has repaid
//     what it owed at the larger share (the ack carries that debt), or when
//     its lease has expired plus the clock-skew margin.
//   - A region counts its lease's lifetime from when it sent the request and
//     stops using it MaxSkew early, so it stops before the leader's expiry.
//   - A new leader (Takeover) treats every lease as unexpired until its
//     takeover time plus the longest lease plus the skew, since the expiries
//     it inherits were read off another clock.

// Config configures a Machine. Every replica must use the same Config.
type Config struct {
	// Regions lists every region that may hold shares. The safe share of
	// each is ⌊L ÷ len(Regions)⌋.
	Regions []string
	// LeaseDuration is a lease's lifetime: much longer than the refresh
	// interval and longer than an election, so a leader change never
	// expires a lease. Zero means DefaultLeaseDuration.
	LeaseDuration time.Duration
	// MaxSkew bounds clock drift between a region and the leader over one
	// lease. Zero means DefaultMaxSkew.
	MaxSkew time.Duration
	// ActiveFor is how long a region counts as active after it last
	// reported demand. Zero means 3 × LeaseDuration.
	ActiveFor time.Duration
	// FloorFraction is the least share of an active region, as a fraction
	// of the limit (raised so that a share's burst covers the largest
	// cost). Zero means DefaultFloorFraction.
	FloorFraction float64
}

// Defaults of Config.
const (
	DefaultLeaseDuration = 10 * time.Second
	DefaultMaxSkew       = 500 * time.Millisecond
	DefaultFloorFraction = 0.05
)

// Rule is what the machine needs of a global rule.
type Rule struct {
	ID string
	// Limit is L, tokens per Window; Burst is the global burst B.
	Limit  int64
	Window time.Duration
	Burst  int64
	// MaxCost is the largest cost of one request: every share's burst
	// must cover it.
	MaxCost int64
}

// Errors Apply returns.
var (
	ErrUnknownRule   = errors.New("lease: unknown rule")
	ErrUnknownRegion = errors.New("lease: unknown region")
	ErrBadCommand    = errors.New("lease: malformed command")
)

// Command is one entry of the replicated log.
type Command struct {
	// Now is the proposing leader's clock (unix ns); Apply uses no other.
	Now int64
	// Exactly one of the following is set.
	Report   *Report
	Takeover bool
	Rules    []Rule
	Tick     bool
}

// Report is a region's demand for, and acknowledgement of, its leases,
// sent by the node that owns the identities in the region's ring.
type Report struct {
	// Reporter names the sending node; Seq numbers its reports. A report
	// with a Seq at or below the last applied one from the same reporter
	// changes nothing (a retry) and gets the current leases back.
	Reporter string
	Seq      uint64
	Region   string
	Items    []ReportItem
}

// ReportItem is one (rule, identity) of a Report.
type ReportItem struct {
	Rule, Identity string
	// Demand is what the region was asked for, tokens per window
	// (admitted plus rejected), over the last window.
	Demand int64
	// AckEpoch is the newest epoch the region enforces (0: none yet);
	// Debt is how long its bucket needs, at that share, to be out of debt
	// (ns, ≤ 0 when it holds no debt): capacity it gives up is handed on
	// only after.
	AckEpoch uint64
	Debt     int64
	// Capped: the region gives capacity back. It enforces at most Cap
	// (tokens per window, ≥ 0) for the key from when it sent this report
	// until it accepts a grant that answers this report or a later one,
	// whatever epoch it holds. Only the report that sets a cap carries it
	// (and its retries): a grant answering a later report made before
	// this one was applied may lift the cap. Debt is then how long its
	// bucket, at Cap, needs to be out of debt. The leader lowers the hold to Cap
	// once that debt is repaid, without waiting for a grant and its
	// acknowledgement to travel.
	Capped bool
	Cap    int64
}

// Grant is a lease: the share a region enforces for (Rule, Identity) until
// Lifetime has passed since it sent the report, minus the skew margin.
type Grant struct {
	Rule, Identity string
	Epoch          uint64
	// Share is tokens per window; Burst is the region's burst:
	// ⌊B·Share ÷ L⌋, at least the rule's largest cost when Share > 0.
	Share, Burst int64
	// Lifetime is ns, counted by the region from when it sent its report.
	Lifetime int64
	// Pending is what the allocation would add to Share (tokens per
	// window) once capacity other regions still hold is freed: the region
	// asks again soon while it is throttled (Regional), rather than at its
	// next periodic report. 0 when the share is the region's allocation.
	Pending int64
}

// Result is what Apply returns for a command.
type Result struct {
	Grants []Grant
}

type key struct{ rule, identity string }

// regionLease is the leader's record of one region's lease on one key.
type regionLease struct {
	share   int64  // latest granted share
	epoch   uint64 // of the latest grant; 0: none yet
	expiry  int64  // leader time; math.MaxInt64 for the implicit lease
	hold    int64  // the largest share the region may be enforcing
	release int64  // when hold may drop to relTo (0: nothing pending)
	relTo   int64
	relEp   uint64 // the acknowledged epoch the release is for
	demand  int64
	seen    int64 // when demand was last reported
}

type keyState struct {
	regions []regionLease // by region index
	// over is, after the rule's limit was lowered, the Σ terms granted
	// under the old limit that were still in force then: what Check
	// allows until the regions have given back the difference. It only
	// widens what Check accepts, never what is granted (allocate hands out
	// only L − Σ terms, nothing while that is negative), so it is not part
	// of the replicated state: a restored replica decides the same.
	over int64
}

// Machine is the replicated lease state. It is not safe for concurrent use.
type Machine struct {
	cfg     Config
	lease   int64
	skew    int64
	active  int64
	regions map[string]int
	rules   map[string]Rule
	keys    map[key]*keyState
	seqs    map[string]uint64
	guard   int64 // every lease counts as unexpired until then
	now     int64 // the latest command time applied
	epoch   uint64
}

// bump returns a new epoch, larger than every one before.
func (m *Machine) bump() uint64 {
	m.epoch++
	return m.epoch
}

// NewMachine returns an empty machine. It fails if Config names no region,
// or a region twice.
func NewMachine(cfg Config) (*Machine, error) {
	if len(cfg.Regions) == 0 {
		return nil, errors.New("lease: Config.Regions: at least one region is required")
	}
	if cfg.LeaseDuration <= 0 {
		cfg.LeaseDuration = DefaultLeaseDuration
	}
	if cfg.MaxSkew <= 0 {
		cfg.MaxSkew = DefaultMaxSkew
	}
	if cfg.ActiveFor <= 0 {
		cfg.ActiveFor = 3 * cfg.LeaseDuration
	}
	if cfg.FloorFraction <= 0 {
		cfg.FloorFraction = DefaultFloorFraction
	}
	if cfg.MaxSkew >= cfg.LeaseDuration {
		return nil, fmt.Errorf("lease: Config.MaxSkew %v must be shorter than LeaseDuration %v", cfg.MaxSkew, cfg.LeaseDuration)
	}
	m := &Machine{cfg: cfg, lease: int64(cfg.LeaseDuration), skew: int64(cfg.MaxSkew), active: int64(cfg.ActiveFor),
		regions: map[string]int{}, rules: map[string]Rule{}, keys: map[key]*keyState{}, seqs: map[string]uint64{}}
	m.cfg.Regions = slices.Clone(cfg.Regions)
	slices.Sort(m.cfg.Regions)
	for i, r := range m.cfg.Regions {
		if r == "" {
			return nil, errors.New("lease: Config.Regions: empty region name")
		}
		if _, dup := m.regions[r]; dup {
			return nil, fmt.Errorf("lease: Config.Regions: %q appears twice", r)
		}
		m.regions[r] = i
	}
	return m, nil
}

// Now returns the latest command time applied (unix ns, the leader's
// clock).
func (m *Machine) Now() int64 { return m.now }

// Regions returns the regions, sorted; region indexes follow this order.
func (m *Machine) Regions() []string { return slices.Clone(m.cfg.Regions) }

// ValidateRule reports why a global rule cannot be leased across the
// machine's regions, or nil: every region's safe share must give a burst
// that covers the largest cost (B ÷ regions ≥ MaxCost).
func (m *Machine) ValidateRule(r Rule) error {
	switch {
	case r.ID == "":
		return fmt.Errorf("%w: rule with an empty id", ErrBadCommand)
	case r.Limit <= 0 || r.Window <= 0 || r.Burst <= 0:
		return fmt.Errorf("%w: rule %q: limit, window and burst must be positive", ErrBadCommand, r.ID)
	case r.MaxCost <= 0:
		return fmt.Errorf("%w: rule %q: max cost must be positive", ErrBadCommand, r.ID)
	case r.Burst/int64(len(m.cfg.Regions)) < r.MaxCost:
		return fmt.Errorf("%w: rule %q: burst %d over %d regions leaves a share's burst below the largest cost %d",
			ErrBadCommand, r.ID, r.Burst, len(m.cfg.Regions), r.MaxCost)
	}
	return nil
}

// safe is the safe share of every region.
func (m *Machine) safe(r Rule) int64 { return r.Limit / int64(len(m.cfg.Regions)) }

// Floor is the least nonzero share the machine allocates an active region
// under rule r (tokens per window): the floor fraction of L
// (Config.FloorFraction), raised so that the share's burst ⌊B·floor ÷ L⌋
// covers MaxCost, and never above the safe share L ÷ regions. Allocate is
// called with it.
func (m *Machine) Floor(r Rule) int64 {
	f := int64(math.Ceil(m.cfg.FloorFraction * float64(r.Limit)))
	need := (r.MaxCost*r.Limit + r.Burst - 1) / r.Burst
	return min(max(f, need, 1), m.safe(r))
}

// burst is a share's burst.
func burst(r Rule, share int64) int64 {
	if share <= 0 {
		return 0
	}
	return max(r.Burst*share/r.Limit, r.MaxCost)
}

// term is the most region lease l may be enforcing at now, as the invariant
// counts it.
func (m *Machine) term(r Rule, l *regionLease, now int64) int64 {
	if now < m.guard || now < l.expiry+m.skew || l.expiry == math.MaxInt64 {
		return l.hold
	}
	return min(m.safe(r), l.hold)
}

// Apply applies one command. A malformed command changes nothing and
// returns an error wrapping ErrBadCommand (or ErrUnknownRule,
// ErrUnknownRegion); commands are applied in log order, and a command whose
// Now is behind the latest one applied is applied at the latest (the log
// order is the time order).
func (m *Machine) Apply(c Command) (Result, error) {
	n := 0
	if c.Report != nil {
		n++
	}
	if c.Takeover {
		n++
	}
	if c.Rules != nil {
		n++
	}
	if c.Tick {
		n++
	}
	if n != 1 {
		return Result{}, fmt.Errorf("%w: %d kinds set, want exactly one", ErrBadCommand, n)
	}
	now := max(c.Now, m.now)
	switch {
	case c.Rules != nil:
		return Result{}, m.setRules(c.Rules)
	case c.Takeover:
		m.now = now
		m.guard = now + m.lease + m.skew
		return Result{}, nil
	case c.Tick:
		m.now = now
		m.tick(now)
		return Result{}, nil
	}
	return m.report(now, c.Report)
}

func (m *Machine) setRules(rules []Rule) error {
	next := make(map[string]Rule, len(rules))
	for _, r := range rules {
		if err := m.ValidateRule(r); err != nil {
			return err
		}
		if _, dup := next[r.ID]; dup {
			return fmt.Errorf("%w: rule %q appears twice", ErrBadCommand, r.ID)
		}
		next[r.ID] = r
	}
	// A lowered limit under live leases: the holds granted under the old
	// one stay counted until their regions acknowledge smaller shares or
	// their leases expire (the leader cannot take capacity back), and no
	// region grows meanwhile (allocate hands out only what is free under
	// the new limit). So Σ terms falls from what it was, at most the old
	// limit, to the new limit; each key remembers where it started for
	// Check. A raised limit is free capacity at the next allocation.
	// Regions rebuild their safe shares from the new rule (Holder.SetRule).
	for id, nr := range next {
		or, ok := m.rules[id]
		if !ok || nr.Limit >= or.Limit {
			continue
		}
		for k, ks := range m.keys {
			if k.rule != id {
				continue
			}
			var sum int64
			for i := range ks.regions {
				sum += m.term(or, &ks.regions[i], m.now)
			}
			if sum > nr.Limit {
				ks.over = max(ks.over, sum)
			}
		}
	}
	m.rules = next
	return nil
}

func (m *Machine) report(now int64, rep *Report) (Result, error) {
	ri, ok := m.regions[rep.Region]
	if !ok {
		return Result{}, fmt.Errorf("%w %q", ErrUnknownRegion, rep.Region)
	}
	if rep.Reporter == "" {
		return Result{}, fmt.Errorf("%w: report with no reporter", ErrBadCommand)
	}
	for i, it := range rep.Items {
		if _, ok := m.rules[it.Rule]; !ok {
			return Result{}, fmt.Errorf("%w %q (item %d)", ErrUnknownRule, it.Rule, i)
		}
		if it.Demand < 0 {
			return Result{}, fmt.Errorf("%w: item %d: negative demand", ErrBadCommand, i)
		}
		if it.Capped && it.Cap < 0 {
			return Result{}, fmt.Errorf("%w: item %d: negative cap", ErrBadCommand, i)
		}
	}
	m.now = now
	retry := rep.Seq <= m.seqs[rep.Reporter]
	if !retry {
		m.seqs[rep.Reporter] = rep.Seq
	}
	res := Result{Grants: make([]Grant, 0, len(rep.Items))}
	for _, it := range rep.Items {
		r := m.rules[it.Rule]
		k := key{it.Rule, it.Identity}
		ks := m.keys[k]
		if ks == nil {
			ks = m.newKey(r)
			m.keys[k] = ks
		}
		var pending int64
		if !retry {
			l := &ks.regions[ri]
			l.demand, l.seen = it.Demand, now
			if it.AckEpoch != 0 && it.AckEpoch == l.epoch && l.share < l.hold && (l.relEp != l.epoch || l.release == 0) {
				// The region enforces the smaller share: hold drops
				// once what it owed at the larger one is repaid. The
				// first acknowledgement of the epoch sets when: the
				// debt it carries is what was spent at the larger
				// share; later reports' debt is spending at the
				// smaller one, and must not push the release back
				// (a region that stays throttled would otherwise
				// never give capacity up).
				l.release, l.relTo, l.relEp = now+max(it.Debt, 0), l.share, l.epoch
			}
			capTo := it.Cap
			if it.AckEpoch != 0 && it.AckEpoch == l.epoch {
				capTo = min(capTo, l.share) // it enforces the latest share too
			}
			if it.Capped && capTo < l.hold {
				// The region gives capacity back: it enforces at most
				// Cap since it sent this report, and until it accepts a
				// grant answering this report or a later one. Every such
				// grant is made from now on (a later report applied
				// first makes this one a retry), at the share set here
				// or one a later allocation counts in hold. So hold may
				// drop to Cap once the debt is repaid, unless a grant
				// changes the share first (a new epoch marks this one).
				l.share = min(l.share, capTo)
				l.epoch = m.bump()
				l.release, l.relTo, l.relEp = now+max(it.Debt, 0), capTo, l.epoch
			}
			m.settle(r, ks, now)
			target := m.allocate(r, ks, now)
			// The report renews this region's lease.
			if l.epoch != 0 {
				l.expiry = now + m.lease
			}
			pending = max(target[ri]-ks.regions[ri].share, 0)
		}
		l := &ks.regions[ri]
		g := Grant{Rule: it.Rule, Identity: it.Identity, Epoch: l.epoch, Share: l.share, Burst: burst(r, l.share), Pending: pending}
		if l.epoch != 0 {
			g.Lifetime = l.expiry - now
		}
		res.Grants = append(res.Grants, g)
	}
	return res, nil
}

func (m *Machine) newKey(r Rule) *keyState {
	ks := &keyState{regions: make([]regionLease, len(m.cfg.Regions))}
	for i := range ks.regions {
		ks.regions[i] = regionLease{expiry: math.MaxInt64}
	}
	return ks
}

// settle applies what time has done: pending releases that are due, and
// leases expired past the skew margin (whose holder now enforces at most
// min(safe, hold)).
func (m *Machine) settle(r Rule, ks *keyState, now int64) {
	safe := m.safe(r)
	for i := range ks.regions {
		l := &ks.regions[i]
		if l.release != 0 && now >= l.release {
			// Only if nothing was granted since the acknowledged epoch: a
			// later grant may have raised what the region holds.
			if l.epoch == l.relEp {
				l.hold = l.relTo
			}
			l.release = 0
		}
		if now >= m.guard && l.expiry != math.MaxInt64 && now >= l.expiry+m.skew && l.hold > safe {
			l.hold = safe
			if l.share > l.hold {
				l.share = l.hold
				l.epoch = m.bump()
			}
		}
	}
}

// allocate moves every region's share toward the max-min fair allocation of
// the demands: shrinks at once (hold follows on acknowledgement), grows
// only by free capacity. It returns the allocation.
func (m *Machine) allocate(r Rule, ks *keyState, now int64) []int64 {
	n := len(ks.regions)
	demand := make([]int64, n)
	active := make([]bool, n)
	for i := range ks.regions {
		l := &ks.regions[i]
		demand[i] = l.demand
		// After a leader change, a region's last report counts as
		// recent from the takeover on: the regions that report first
		// must not find the others idle because the leader was away.
		since := l.seen
		if takeover := m.guard - m.lease - m.skew; m.guard != 0 && since != 0 && takeover > since {
			since = takeover
		}
		active[i] = l.seen != 0 && now-since < m.active && l.demand > 0
	}
	target := Allocate(r.Limit, m.Floor(r), demand, active)
	for i := range ks.regions {
		l := &ks.regions[i]
		if target[i] < l.share {
			l.share = target[i]
			l.epoch = m.bump()
			if l.expiry == math.MaxInt64 {
				l.expiry = now + m.lease
			}
		}
	}
	var used int64
	for i := range ks.regions {
		used += m.term(r, &ks.regions[i], now)
	}
	if used <= r.Limit {
		ks.over = 0 // a lowered limit's transition is over
	}
	free := r.Limit - used
	for i := range ks.regions {
		l := &ks.regions[i]
		if target[i] <= l.share || free <= 0 {
			continue
		}
		// The region's term may rise by at most the free capacity.
		old := m.term(r, l, now)
		most := old + free
		share := min(target[i], most)
		// A share below the floor would have a burst below the largest
		// cost; a hold above what is free cannot be renewed (settle keeps
		// that from happening).
		if share <= l.share || share < m.Floor(r) || l.hold > most {
			continue
		}
		hold := max(l.hold, share)
		free -= hold - old
		l.share, l.hold, l.expiry = share, hold, now+m.lease
		l.epoch = m.bump()
	}
	return target
}

// tick settles every key, and drops keys whose state is the initial one
// again: no region holds or may hold anything.
func (m *Machine) tick(now int64) {
	keys := make([]key, 0, len(m.keys))
	for k := range m.keys {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b key) int {
		return cmp.Or(cmp.Compare(a.rule, b.rule), cmp.Compare(a.identity, b.identity))
	})
	for _, k := range keys {
		ks := m.keys[k]
		r, ok := m.rules[k.rule]
		if !ok {
			if m.expired(ks, now) {
				delete(m.keys, k)
			}
			continue
		}
		m.settle(r, ks, now)
		m.allocate(r, ks, now)
		if empty(ks) {
			delete(m.keys, k)
		}
	}
}

// empty reports whether ks equals a key never seen: every region's share
// and hold are 0 with nothing pending.
func empty(ks *keyState) bool {
	for i := range ks.regions {
		if l := &ks.regions[i]; l.share != 0 || l.hold != 0 || l.release != 0 {
			return false
		}
	}
	return true
}

// expired reports whether every lease on ks has ended (past expiry and skew,
// and past the takeover guard).
func (m *Machine) expired(ks *keyState, now int64) bool {
	if now < m.guard {
		return false
	}
	for i := range ks.regions {
		if l := &ks.regions[i]; l.expiry == math.MaxInt64 || now < l.expiry+m.skew {
			return false
		}
	}
	return true
}

// Check verifies the invariant Σᵣ termᵣ ≤ L for every key at the latest
// command time, and returns an error naming the first key that breaks it.
// Tests call it after every step. After L was lowered, a key's bound is what
// was granted under the old L until Σᵣ termᵣ has come down to the new one
// (see setRules): it never rises.
func (m *Machine) Check() error {
	return m.CheckAt(m.now)
}

// CheckAt is Check at a given time (at or after the latest command).
func (m *Machine) CheckAt(now int64) error {
	keys := slices.SortedFunc(maps.Keys(m.keys), func(a, b key) int {
		return cmp.Or(cmp.Compare(a.rule, b.rule), cmp.Compare(a.identity, b.identity))
	})
	for _, k := range keys {
		ks := m.keys[k]
		r, ok := m.rules[k.rule]
		if !ok {
			continue
		}
		var sum int64
		for i := range ks.regions {
			sum += m.term(r, &ks.regions[i], now)
		}
		if sum > max(r.Limit, ks.over) {
			if ks.over > r.Limit {
				return fmt.Errorf("lease: invariant broken for %s/%q: Σ terms %d > %d, granted under the limit before it was lowered to %d", k.rule, k.identity, sum, ks.over, r.Limit)
			}
			return fmt.Errorf("lease: invariant broken for %s/%q: Σ terms %d > limit %d", k.rule, k.identity, sum, r.Limit)
		}
	}
	return nil
}

// LeaseView is the leader's record of one region's lease on one (rule,
// identity), as Machine.View returns it: tokens per window.
type LeaseView struct {
	Region string
	// Share is the latest share granted, Epoch its epoch (0: none yet);
	// Hold is the largest share the region may be enforcing, and Term what
	// the invariant counts for the region at the time asked (Hold, or
	// min(safe share, Hold) once the lease has expired past the skew).
	Share, Hold, Term int64
	Epoch             uint64
	// Releasing: the region acknowledged a smaller share (or gave capacity
	// back) and Hold drops once its debt is repaid.
	Releasing bool
	// Expired: the lease has expired past the skew margin at the time
	// asked (after a takeover's guard).
	Expired bool
}

// View returns the leader's record of every region's lease on (rule,
// identity) at now, in region order, or nil for a key the machine does not
// hold (no region holds or may hold anything) or a rule it does not know.
// It changes nothing.
func (m *Machine) View(rule, identity string, now int64) []LeaseView {
	ks := m.keys[key{rule, identity}]
	r, ok := m.rules[rule]
	if ks == nil || !ok {
		return nil
	}
	out := make([]LeaseView, len(ks.regions))
	for i := range ks.regions {
		l := &ks.regions[i]
		out[i] = LeaseView{Region: m.cfg.Regions[i], Share: l.share, Hold: l.hold, Term: m.term(r, l, now), Epoch: l.epoch,
			Releasing: l.release != 0,
			Expired:   now >= m.guard && l.expiry != math.MaxInt64 && now >= l.expiry+m.skew}
	}
	return out
}

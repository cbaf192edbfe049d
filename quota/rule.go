package quota

import (
	"math/bits"
	"slices"
	"strings"
	"time"
)

// Algorithm names the limiting algorithm of a rule. The zero value "" means
// AlgorithmGCRA. "token_bucket" is accepted as an alias and normalised to
// "gcra" (GCRA is an exact token bucket without a refill timer).
type Algorithm string

// The algorithms a rule may use.
const (
	// AlgorithmGCRA is the generic cell rate algorithm: a token bucket of
	// Burst tokens refilled at Limit per Window. The default.
	AlgorithmGCRA Algorithm = "gcra"
	// AlgorithmTokenBucket is an alias of AlgorithmGCRA, normalised away.
	AlgorithmTokenBucket Algorithm = "token_bucket"
	// AlgorithmFixedWindow admits Limit per aligned Window.
	AlgorithmFixedWindow Algorithm = "fixed_window"
	// AlgorithmSlidingWindow weights the previous window's count (sliding counter).
	AlgorithmSlidingWindow Algorithm = "sliding_window"
	// AlgorithmSlidingLog keeps one timestamp per admission; Limit is capped
	// at MaxSlidingLogLimit.
	AlgorithmSlidingLog Algorithm = "sliding_log"
	// AlgorithmLeakyBucket queues requests up to MaxDelay and releases them
	// at Limit per Window.
	AlgorithmLeakyBucket Algorithm = "leaky_bucket"
	// AlgorithmConcurrency limits requests in flight to Limit. A slot is
	// held until the request ends; Window is required but not used by it.
	AlgorithmConcurrency Algorithm = "concurrency"
)

// MaxSlidingLogLimit is the largest Limit (and override or tier limit) a
// sliding_log rule may have: the log holds one timestamp per admission.
const MaxSlidingLogLimit = 10000

// Mode says where a rule's decisions are made (docs/cluster.md, "Modes").
// The zero value "" means ModeShared for GCRA rules and ModeLocal for the
// other algorithms.
type Mode string

// The modes a rule may use.
const (
	// ModeShared is the two-tier mode: nodes admit within a slack and sync
	// with the identity's owner. GCRA only.
	ModeShared Mode = "shared"
	// ModeExact sends every admission to the identity's owner.
	ModeExact Mode = "exact"
	// ModeLocal enforces the rule per node only.
	ModeLocal Mode = "local"
)

// Scope says whether a limit is per region or shared by all regions.
// The zero value "" means ScopeRegion.
type Scope string

// The scopes a rule may use.
const (
	// ScopeRegion applies the limit in each region separately. The default.
	ScopeRegion Scope = "region"
	// ScopeGlobal leases each region a share of one global limit. GCRA only.
	ScopeGlobal Scope = "global"
)

// OnFailure says what a node does when it cannot reach the identity's owner.
// The zero value "" means OnFailureLocal.
type OnFailure string

// The failure policies a rule may use.
const (
	// OnFailureLocal enforces limit ÷ live nodes on this node. The default.
	OnFailureLocal OnFailure = "local"
	// OnFailureOpen admits the request.
	OnFailureOpen OnFailure = "open"
	// OnFailureClosed rejects the request.
	OnFailureClosed OnFailure = "closed"
)

// KeyKind names where an identity comes from.
type KeyKind string

// The key kinds a KeySource may have.
const (
	// KeyHeader takes the identity from the request header named by
	// KeySource.Name (canonicalised, e.g. "X-Api-Key").
	KeyHeader KeyKind = "header"
	// KeyUser takes the identity from a function the caller supplies
	// (an authenticated user id, for example).
	KeyUser KeyKind = "user"
	// KeyIP takes the identity from the client IP.
	KeyIP KeyKind = "ip"
	// KeyGlobal yields one constant identity: one bucket for all requests.
	// It never yields an empty value, so it may only be last in a chain.
	KeyGlobal KeyKind = "global"
)

// KeySource is one link of a rule's identity chain. Name is the header name
// for KeyHeader and must be empty for the other kinds.
type KeySource struct {
	Kind KeyKind
	Name string
}

// String returns the YAML form: "header:X-Api-Key", "user", "ip", "global".
func (k KeySource) String() string {
	if k.Kind == KeyHeader {
		return "header:" + k.Name
	}
	return string(k.Kind)
}

// Match selects the requests a rule applies to. At most one of Path, Prefix
// and Pattern may be set; when none is, the rule applies to every path.
// Paths are compared as given: the caller should pass a cleaned URL path
// (path.Clean), or "/a/../search" will not match prefix "/search".
type Match struct {
	// Path matches one exact path, e.g. "/login".
	Path string
	// Prefix matches a path prefix on segment boundaries: "/search" matches
	// "/search", "/search/" and "/search/x" but not "/searchx". A trailing
	// "/" is ignored ("/search/" ≡ "/search"); "/" matches every path.
	Prefix string
	// Pattern matches segment by segment: "/v1/users/{id}/orders", where
	// "{name}" matches exactly one non-empty segment and a final "*" matches
	// the rest of the path, including nothing ("/files/*" matches "/files").
	Pattern string
	// Methods lists the HTTP methods the rule applies to, compared without
	// regard to case and normalised to upper case; empty means all methods.
	Methods []string
}

// Override gives one identity (a customer's API key, say) its own limits.
// A zero Limit or Burst inherits the value that would apply without the
// override (the tier's, else the rule's).
type Override struct {
	Identity string
	Limit    int64
	Burst    int64
	// Source is the source of the rule's key chain whose identity the
	// override matches: identity sources are namespaces, so an override
	// for the API key "abc" does not apply to a user named "abc". The zero
	// KeySource means the chain's first source; NewSet normalises a Source
	// equal to the first source to the zero value. It must be one of the
	// chain's sources, and not global. Omitted from the digest's canonical
	// form when zero, so that overrides without it keep their digests.
	Source KeySource `json:",omitzero"`
}

// MaxTiers is the most tiers a rule may have. (A node records in each
// stored state the tier it was written under, in a tag of a few bits.)
const MaxTiers = 1000

// Tier gives identities of a named tier (supplied by the caller, e.g. from
// the customer's plan) their own limits. Limit must be positive; a zero
// Burst inherits the rule's burst.
type Tier struct {
	Name  string
	Limit int64
	Burst int64
}

// Penalty locks an identity out after repeated rejections: After rejections
// within Within lock it out for Base, doubling on each repeat, capped at Max.
// A zero Within means DefaultPenaltyWithin.
type Penalty struct {
	After  int64
	Within time.Duration
	Base   time.Duration
	Max    time.Duration
}

// Sketch gates a shared gcra rule's identities through a count-min sketch
// per node (docs/overshoot.md, "Sketch gating"): an identity a
// node has no entry for is admitted there with no entry, no sync and no
// owner bucket while the sketch's estimate of its spend on that node in the
// current period stays at most min(Threshold, the node's slack); past that
// it gets a real entry and joins the sync. Memory and sync traffic then
// follow the heavy hitters, not every identity, at the price of up to
// Threshold unreported tokens per identity, node and period. A zero Period,
// Width or Depth means its default (NewSet fills them in).
type Sketch struct {
	// Threshold is the most tokens one identity may spend on one node in
	// one period before it is tracked; in [1, MaxSketchThreshold].
	Threshold int64
	// Period is how often the sketch starts over, at multiples of Period
	// since the Unix epoch; zero means the rule's Window, and it may not
	// be shorter than the Window.
	Period time.Duration
	// Width is the number of counters per row; zero means
	// DefaultSketchWidth; at most MaxSketchWidth.
	Width int64
	// Depth is the number of rows (hash functions); zero means
	// DefaultSketchDepth; at most MaxSketchDepth.
	Depth int64
}

// Sketch limits and defaults. A sketch takes Width × Depth bytes per rule
// and node (one-byte counters), allocated on its first use. The estimate
// never undercounts, so the sketch's error never admits more than Threshold
// per identity, node and period; it only tracks some light identities that
// collided with others. For a stream of M tokens per node and period,
// count-min's bound is: estimate ≤ true + e·M/Width with probability at
// least 1 − e^−Depth (Width 65536, Depth 4: true + 4.1e-5·M, 98.2 %). With
// M up to 2 × Width, a one-token identity is tracked by mistake with a
// probability of about P(Poisson(2) ≥ 4)^4 ≈ 4e-4 at Threshold 4 for a
// plain count-min at its fullest, less with the conservative update weir
// uses: size Width to at least half the tokens a node sees per period.
const (
	// MaxSketchThreshold is the largest Sketch.Threshold: counters are
	// one byte.
	MaxSketchThreshold = 255
	// DefaultSketchWidth is the default Sketch.Width (64 KiB per row).
	DefaultSketchWidth = 1 << 16
	// MaxSketchWidth is the largest Sketch.Width.
	MaxSketchWidth = 1 << 24
	// DefaultSketchDepth is the default Sketch.Depth.
	DefaultSketchDepth = 4
	// MaxSketchDepth is the largest Sketch.Depth.
	MaxSketchDepth = 8
)

// Defaults applied by NewSet to fields left at their zero value.
const (
	// DefaultAccuracy is the fraction of the limit a cluster may overshoot.
	DefaultAccuracy = 0.05
	// DefaultPenaltyWithin is the default Penalty.Within.
	DefaultPenaltyWithin = time.Minute
	// DefaultCost is the default Rule.Cost.
	DefaultCost = 1
)

// Rule is one rate limit: Limit requests (tokens) per Window per identity,
// with bursts of up to Burst, on the requests Match selects. Zero values of
// optional fields mean their documented defaults; NewSet fills them in.
type Rule struct {
	// ID names the rule in errors, metrics and headers; required, matching
	// ^[a-zA-Z0-9_.:-]{1,128}$ and unique within a set.
	ID string
	// Description is free text for humans (valid UTF-8).
	Description string
	// Match selects the requests; the zero Match selects all of them.
	Match Match
	// Key is the identity chain: the first source that yields a non-empty
	// value is the identity. Empty means one global bucket ([global]).
	Key []KeySource
	// Limit is the number of tokens per Window; required, positive, and at
	// most one per nanosecond of Window.
	Limit int64
	// Window is the period Limit is counted over; required, positive.
	Window time.Duration
	// Burst is the most tokens that may be spent at once; zero means Limit.
	Burst int64
	// Cost is the tokens one request spends; zero means 1. At most Burst.
	Cost int64
	// CostByMethod overrides Cost per HTTP method (keys upper-cased); every
	// value is in [1, Burst].
	CostByMethod map[string]int64
	// Algorithm is the limiting algorithm; "" means gcra.
	Algorithm Algorithm
	// Mode says where decisions are made; "" means shared for gcra, local
	// for the other algorithms.
	Mode Mode
	// Durable keeps the counters in the Raft lease group (gcra only, not
	// with mode local).
	Durable bool
	// Scope is region (default) or global (gcra only).
	Scope Scope
	// OnFailure is the policy when the owner is unreachable; "" means local.
	OnFailure OnFailure
	// Accuracy is the fraction of the limit the cluster may overshoot, in
	// (0, 0.5]; zero means DefaultAccuracy (0.05).
	Accuracy float64
	// Shadow makes the rule never reject; would-be rejections are counted.
	Shadow bool
	// CountRejected, for fixed_window only, counts every request's cost in
	// the window, admitted or not, as envoyproxy/ratelimit's counter does
	// (bucket.FixedWindow.CountingRejected): once a rejection pushed the
	// count past Limit, nothing passes until the window ends, and a
	// rejection's Remaining is 0. It admits less than the default under
	// overload, by design (docs/overshoot.md). Omitted from the digest's
	// canonical form when false, so that rules without it keep their
	// digests.
	CountRejected bool `json:",omitempty"`
	// EnforceRegions, with Shadow, names the regions where the rule is
	// enforced after all: a rule is shadowed first, then enforced region
	// by region (the node's region is ClusterConfig.Region; a node with no
	// cluster has none). Each name matches ^[a-zA-Z0-9_.:-]{1,128}$ and
	// appears once; NewSet sorts them. Omitted from the digest's canonical
	// form when empty, so that rules without it keep their digests.
	EnforceRegions []string `json:",omitempty"`
	// MaxDelay is, for leaky_bucket only, the longest a request may queue;
	// zero means (Burst-1) × Window/Limit.
	MaxDelay time.Duration
	// Overrides are per-identity limits; identities are unique.
	Overrides []Override
	// Tiers are per-tier limits; names are unique.
	Tiers []Tier
	// Penalty, when not nil, locks out identities that keep being rejected.
	Penalty *Penalty
	// Sketch, when not nil, gates identities through a count-min sketch
	// before they get a bucket (shared gcra rules only). Omitted from the
	// digest's canonical form when nil, so that rules without it keep
	// their digests.
	Sketch *Sketch `json:",omitempty"`
}

// CostFor returns the tokens a request with the given method spends: the
// CostByMethod entry for the method (looked up as given, then upper-cased),
// else Cost, else 1.
func (r Rule) CostFor(method string) int64 {
	if len(r.CostByMethod) > 0 {
		if c, ok := r.CostByMethod[method]; ok {
			return c
		}
		if hasLower(method) {
			if c, ok := r.CostByMethod[strings.ToUpper(method)]; ok {
				return c
			}
		}
	}
	if r.Cost <= 0 {
		return DefaultCost
	}
	return r.Cost
}

// maxCost returns the largest cost any request can have under r.
func (r Rule) maxCost() int64 {
	c := r.CostFor("")
	for _, v := range r.CostByMethod {
		c = max(c, v)
	}
	return c
}

func hasLower(s string) bool {
	for i := 0; i < len(s); i++ {
		if 'a' <= s[i] && s[i] <= 'z' {
			return true
		}
	}
	return false
}

// effectiveBurst returns Burst, or Limit when Burst is zero.
func (r Rule) effectiveBurst() int64 {
	if r.Burst == 0 {
		return r.Limit
	}
	return r.Burst
}

// LimitsFor returns the limit (per Window) and burst for an identity of the
// key chain's first source in a tier: LimitsForSource with the zero source.
func (r Rule) LimitsFor(identity, tier string) (limit, burst int64) {
	return r.LimitsForSource(KeySource{}, identity, tier)
}

// LimitsForSource returns the limit (per Window) and burst for an identity
// that source of the key chain yielded, in a tier: an Override for the
// identity and source beats a Tier of that name, which beats the rule; zero
// fields of an override or tier inherit from the next level. The zero
// source, or one equal to the chain's first source, means the first source.
// It scans Overrides and Tiers linearly; Set.LimitsForSource uses an index.
func (r Rule) LimitsForSource(source KeySource, identity, tier string) (limit, burst int64) {
	source = r.overrideSource(source)
	var ov *Override
	for i := range r.Overrides {
		if r.Overrides[i].Identity == identity && r.overrideSource(r.Overrides[i].Source) == source {
			ov = &r.Overrides[i]
			break
		}
	}
	var tr *Tier
	if tier != "" {
		for i := range r.Tiers {
			if r.Tiers[i].Name == tier {
				tr = &r.Tiers[i]
				break
			}
		}
	}
	return r.resolveLimits(ov, tr)
}

// overrideSource returns source in the form overrides are matched by: the
// zero KeySource for the chain's first source (or for no chain), the
// normalised source otherwise.
func (r Rule) overrideSource(source KeySource) KeySource {
	if source == (KeySource{}) {
		return source
	}
	source = normalizeKey(source)
	if len(r.Key) == 0 || normalizeKey(r.Key[0]) == source {
		return KeySource{}
	}
	return source
}

func (r Rule) resolveLimits(ov *Override, tr *Tier) (limit, burst int64) {
	limit, burst = r.Limit, r.effectiveBurst()
	if tr != nil {
		if tr.Limit > 0 {
			limit = tr.Limit
		}
		if tr.Burst > 0 {
			burst = tr.Burst
		}
	}
	if ov != nil {
		if ov.Limit > 0 {
			limit = ov.Limit
		}
		if ov.Burst > 0 {
			burst = ov.Burst
		}
	}
	return limit, burst
}

// QueueDelay returns the longest a request may queue under a leaky_bucket
// rule r for an identity decided at the given limit and burst (the rule's
// own, or an override's or tier's): MaxDelay when the rule sets it, else
// (burst−1) × window ÷ limit, so an override or tier that raises the burst
// lengthens its identities' queue.
func (r *Rule) QueueDelay(limit, burst int64) time.Duration {
	if r.MaxDelay > 0 {
		return r.MaxDelay
	}
	return defaultMaxDelay(burst, limit, r.Window)
}

// defaultMaxDelay returns (burst-1) × window/limit, saturating at the
// largest Duration. limit and burst must be positive.
func defaultMaxDelay(burst, limit int64, window time.Duration) time.Duration {
	if burst <= 1 || limit <= 0 || window <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(burst-1), uint64(window))
	if hi >= uint64(limit) {
		return time.Duration(1<<63 - 1)
	}
	q, _ := bits.Div64(hi, lo, uint64(limit))
	if q > 1<<63-1 {
		return time.Duration(1<<63 - 1)
	}
	return time.Duration(q)
}

// normalize returns a deep copy of r with defaults filled in and names in
// canonical form. r must be valid.
func normalize(r Rule) Rule {
	n := r
	switch n.Algorithm {
	case "", AlgorithmTokenBucket:
		n.Algorithm = AlgorithmGCRA
	}
	if n.Mode == "" {
		if n.Algorithm == AlgorithmGCRA {
			n.Mode = ModeShared
		} else {
			n.Mode = ModeLocal
		}
	}
	if n.Scope == "" {
		n.Scope = ScopeRegion
	}
	if n.OnFailure == "" {
		n.OnFailure = OnFailureLocal
	}
	n.Burst = r.effectiveBurst()
	if n.Cost == 0 {
		n.Cost = DefaultCost
	}
	if n.Accuracy == 0 {
		n.Accuracy = DefaultAccuracy
	}
	n.Match = normalizeMatch(r.Match)
	if len(r.EnforceRegions) > 0 {
		n.EnforceRegions = slices.Sorted(slices.Values(r.EnforceRegions))
	} else {
		n.EnforceRegions = nil
	}
	if len(r.Key) == 0 {
		n.Key = []KeySource{{Kind: KeyGlobal}}
	} else {
		n.Key = make([]KeySource, len(r.Key))
		for i, k := range r.Key {
			n.Key[i] = normalizeKey(k)
		}
	}
	n.CostByMethod = nil
	if len(r.CostByMethod) > 0 {
		n.CostByMethod = make(map[string]int64, len(r.CostByMethod))
		for m, c := range r.CostByMethod {
			n.CostByMethod[strings.ToUpper(m)] = c
		}
	}
	n.Overrides, n.Tiers = nil, nil
	if len(r.Overrides) > 0 {
		n.Overrides = append([]Override(nil), r.Overrides...)
		for i := range n.Overrides {
			n.Overrides[i].Source = n.overrideSource(n.Overrides[i].Source)
		}
	}
	if len(r.Tiers) > 0 {
		n.Tiers = append([]Tier(nil), r.Tiers...)
	}
	if r.Penalty != nil {
		p := *r.Penalty
		if p.Within == 0 {
			p.Within = DefaultPenaltyWithin
		}
		n.Penalty = &p
	}
	if r.Sketch != nil {
		sk := *r.Sketch
		if sk.Period == 0 {
			sk.Period = r.Window
		}
		if sk.Width == 0 {
			sk.Width = DefaultSketchWidth
		}
		if sk.Depth == 0 {
			sk.Depth = DefaultSketchDepth
		}
		n.Sketch = &sk
	}
	return n
}

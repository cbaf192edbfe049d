package quota

import (
	"errors"
	"fmt"

	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Sentinel errors, wrapped by every *Error so callers can branch with
// errors.Is.
var (
	// ErrInvalidRule marks a rule that parsed but breaks a validation rule.
	ErrInvalidRule = errors.New("invalid rule")
	// ErrSyntax marks a rules file that is not well-formed: bad YAML, a
	// wrong type, an unknown or duplicate field, a bad duration.
	ErrSyntax = errors.New("rules syntax error")
	// ErrNoRules marks an empty rules file (no YAML document at all). An
	// explicit "rules: []" is a valid empty set; an empty file is refused so
	// that a truncated write or a broken mount cannot silently drop every
	// limit.
	ErrNoRules = errors.New("no rules")
)

// Error is one problem with a rule or a rules file. Parse, LoadFile, Validate
// and NewSet return one *Error per problem, joined with errors.Join, so that
// all problems are reported at once; use errors.As or the
// interface{ Unwrap() []error } of the joined error to walk them.
type Error struct {
	// File is the base name of the rules file; empty for rules built in Go.
	File string
	// Line is the 1-based line of the offending field; zero when unknown.
	Line int
	// Field is the path of the offending field in YAML names, e.g.
	// "rules[3].window" (rules are 0-based); empty for whole-file problems.
	Field string
	// Msg says what is wrong.
	Msg string
	// RuleID is the id of the offending rule, when it has one.
	RuleID string
	// Err is ErrInvalidRule, ErrSyntax or ErrNoRules.
	Err error
}

// Error formats the problem as "rules.yaml:14: rules[3].window: must be
// positive (rule "search")", leaving out the parts that are unknown.
func (e *Error) Error() string {
	var b strings.Builder
	switch {
	case e.File != "" && e.Line > 0:
		b.WriteString(e.File + ":" + strconv.Itoa(e.Line) + ": ")
	case e.File != "":
		b.WriteString(e.File + ": ")
	case e.Line > 0:
		b.WriteString("line " + strconv.Itoa(e.Line) + ": ")
	}
	if e.Field != "" {
		b.WriteString(e.Field + ": ")
	}
	b.WriteString(e.Msg)
	if e.RuleID != "" {
		b.WriteString(" (rule " + strconv.Quote(e.RuleID) + ")")
	}
	return b.String()
}

// Unwrap returns the sentinel the error belongs to.
func (e *Error) Unwrap() error { return e.Err }

// joinErrors joins problems into one error, or returns nil when there are none.
func joinErrors(es []*Error) error {
	if len(es) == 0 {
		return nil
	}
	errs := make([]error, len(es))
	for i, e := range es {
		errs[i] = e
	}
	return errors.Join(errs...)
}

var idRE = regexp.MustCompile(`^[a-zA-Z0-9_.:-]{1,128}$`)

// Validate checks rules and returns every problem found, each an *Error
// naming the rule index, id and field, joined with errors.Join; nil when the
// rules are valid. Zero values of optional fields are valid (they mean the
// documented defaults). Parse and NewSet apply it.
func Validate(rules []Rule) error {
	return joinErrors(validate(rules))
}

type validator struct {
	errs []*Error
	id   string
}

func (v *validator) add(field, format string, args ...any) {
	v.errs = append(v.errs, &Error{Field: field, Msg: fmt.Sprintf(format, args...), RuleID: v.id, Err: ErrInvalidRule})
}

func quote(s string) string { return strconv.Quote(s) }

func validate(rules []Rule) []*Error {
	v := &validator{}
	seen := make(map[string]int, len(rules))
	for i := range rules {
		r := &rules[i]
		p := fmt.Sprintf("rules[%d]", i)
		v.id = ""
		if idRE.MatchString(r.ID) {
			v.id = r.ID
		}
		switch {
		case r.ID == "":
			v.add(p+".id", "required")
		case v.id == "":
			v.add(p+".id", "%s must match %s", quote(r.ID), idRE)
		default:
			if j, dup := seen[r.ID]; dup {
				v.add(p+".id", "duplicate id, also used by rules[%d]", j)
			} else {
				seen[r.ID] = i
			}
		}
		v.rule(p, r)
	}
	return v.errs
}

// rule checks one rule (p is its field path, e.g. "rules[3]"), one group of
// fields per helper. The order of the calls is the order in which a rule's
// problems are reported.
func (v *validator) rule(p string, r *Rule) {
	if !utf8.ValidString(r.Description) {
		v.add(p+".description", "must be valid UTF-8")
	}
	algo := v.enums(p, r)
	v.algorithmNeeds(p, r, algo)
	v.enforceRegions(p, r)
	v.limits(p, r, algo)
	v.match(p+".match", &r.Match)
	v.keys(p+".key", r.Key)
	v.overrides(p, r, algo)
	v.tiers(p, r, algo)
	if r.Sketch != nil {
		v.sketch(p+".sketch", r, algo)
	}
	if r.Penalty != nil {
		v.penalty(p+".penalty", r.Penalty)
	}
}

// enums checks the rule's enumerated fields (algorithm, mode, scope,
// on_failure) against their known values and returns the algorithm the
// rule runs: gcra for the empty value and token_bucket (its alias), and ""
// for an unknown one, so that the checks depending on the algorithm are
// skipped instead of piling up errors on a typo.
func (v *validator) enums(p string, r *Rule) Algorithm {
	algo := r.Algorithm
	switch algo {
	case "", AlgorithmTokenBucket:
		algo = AlgorithmGCRA
	case AlgorithmGCRA, AlgorithmFixedWindow, AlgorithmSlidingWindow, AlgorithmSlidingLog, AlgorithmLeakyBucket, AlgorithmConcurrency:
	default:
		v.add(p+".algorithm", "unknown algorithm %s (want gcra, token_bucket, fixed_window, sliding_window, sliding_log, leaky_bucket or concurrency)", quote(string(algo)))
		algo = "" // unknown: skip the checks that depend on it
	}
	switch r.Mode {
	case "", ModeShared, ModeExact, ModeLocal:
	default:
		v.add(p+".mode", "unknown mode %s (want shared, exact or local)", quote(string(r.Mode)))
	}
	switch r.Scope {
	case "", ScopeRegion, ScopeGlobal:
	default:
		v.add(p+".scope", "unknown scope %s (want region or global)", quote(string(r.Scope)))
	}
	switch r.OnFailure {
	case "", OnFailureLocal, OnFailureOpen, OnFailureClosed:
	default:
		v.add(p+".on_failure", "unknown on_failure %s (want local, open or closed)", quote(string(r.OnFailure)))
	}
	return algo
}

// algorithmNeeds checks the combinations of fields that only some
// algorithms or modes support: shared mode, durable counters and global
// scope are implemented for gcra only, and a durable counter contradicts
// mode local, where each node counts on its own.
func (v *validator) algorithmNeeds(p string, r *Rule, algo Algorithm) {
	if algo != "" && algo != AlgorithmGCRA {
		if r.Mode == ModeShared {
			v.add(p+".mode", "shared mode needs algorithm gcra, not %s (use exact or local)", algo)
		}
		if r.Durable {
			v.add(p+".durable", "durable needs algorithm gcra, not %s", algo)
		}
		if r.Scope == ScopeGlobal {
			v.add(p+".scope", "global scope needs algorithm gcra, not %s", algo)
		}
	}
	if r.Durable && r.Mode == ModeLocal {
		v.add(p+".durable", "durable contradicts mode local (local is enforced per node)")
	}
	if r.CountRejected && algo != "" && algo != AlgorithmFixedWindow {
		v.add(p+".count_rejected", "needs algorithm fixed_window, not %s (only a fixed window counts rejected requests)", algo)
	}
}

// enforceRegions checks enforce_regions: it only means something on a
// shadow rule (a rule without shadow is enforced everywhere), and each
// entry must be a well-formed region name listed once.
func (v *validator) enforceRegions(p string, r *Rule) {
	if len(r.EnforceRegions) > 0 && !r.Shadow {
		v.add(p+".enforce_regions", "only with shadow: true (a rule without shadow is enforced in every region)")
	}
	seenRegion := make(map[string]bool, len(r.EnforceRegions))
	for i, reg := range r.EnforceRegions {
		f := fmt.Sprintf("%s.enforce_regions[%d]", p, i)
		switch {
		case !idRE.MatchString(reg):
			v.add(f, "region %s must match %s", quote(reg), idRE)
		case seenRegion[reg]:
			v.add(f, "region %s appears twice", quote(reg))
		}
		seenRegion[reg] = true
	}
}

// limits checks the rule's numbers: limit, window and burst in range, the
// costs against the burst (a cost above the burst could never pass), the
// accuracy target and max_delay, which only the leaky bucket uses.
func (v *validator) limits(p string, r *Rule, algo Algorithm) {
	if r.Limit <= 0 {
		v.add(p+".limit", "must be positive, got %d", r.Limit)
	}
	if r.Window <= 0 {
		v.add(p+".window", "must be positive, got %s", r.Window)
	}
	v.rate(p+".limit", r.Limit, r.Window, algo)
	burstOK := r.Burst >= 0
	if !burstOK {
		v.add(p+".burst", "must be positive, got %d", r.Burst)
	}
	v.costs(p, r, burstOK)
	if r.Accuracy != 0 && !(r.Accuracy > 0 && r.Accuracy <= 0.5) {
		v.add(p+".accuracy", "must be in (0, 0.5], got %v", r.Accuracy)
	}
	if r.MaxDelay < 0 {
		v.add(p+".max_delay", "must be positive, got %s", r.MaxDelay)
	} else if r.MaxDelay > 0 && algo != "" && algo != AlgorithmLeakyBucket {
		v.add(p+".max_delay", "only applies to leaky_bucket, not %s", algo)
	}
}

// costs checks cost and cost_by_method: each at least 1 and at most the
// effective burst (compared only when the burst itself is valid, burstOK),
// and each method a valid HTTP token listed once regardless of case, since
// methods are matched case-insensitively.
func (v *validator) costs(p string, r *Rule, burstOK bool) {
	burst := r.effectiveBurst()
	if r.Cost < 0 {
		v.add(p+".cost", "must be at least 1, got %d", r.Cost)
	} else if c := r.CostFor(""); burstOK && burst > 0 && c > burst {
		v.add(p+".cost", "%d is above the burst %d, so no request could ever pass", c, burst)
	}
	upper := make(map[string]string, len(r.CostByMethod))
	for _, m := range sortedKeys(r.CostByMethod) {
		c := r.CostByMethod[m]
		f := p + ".cost_by_method." + m
		if !validToken(m) {
			v.add(f, "%s is not a valid HTTP method token", quote(m))
		}
		u := strings.ToUpper(m)
		if prev, dup := upper[u]; dup {
			v.add(f, "duplicate method, same as %s", prev)
		}
		upper[u] = m
		if c < 1 {
			v.add(f, "must be at least 1, got %d", c)
		} else if burstOK && burst > 0 && c > burst {
			v.add(f, "%d is above the burst %d, so no %s request could ever pass", c, burst, u)
		}
	}
}

// overrides checks the rule's per-identity overrides: each names a source
// of the rule's key and an identity not overridden twice for that source,
// sets a limit or a burst, and keeps its burst at or above the rule's
// largest cost so that every request can still pass.
func (v *validator) overrides(p string, r *Rule, algo Algorithm) {
	maxCost := r.maxCost()
	ids := make(map[overrideKey]int, len(r.Overrides))
	for j, o := range r.Overrides {
		f := fmt.Sprintf("%s.overrides[%d]", p, j)
		src := v.overrideSource(f+".source", r, o.Source)
		if o.Identity == "" {
			v.add(f+".identity", "required")
		} else if k, dup := ids[overrideKey{src, o.Identity}]; dup {
			v.add(f+".identity", "duplicate identity %s of the same source, also in overrides[%d]", quote(o.Identity), k)
		} else {
			ids[overrideKey{src, o.Identity}] = j
		}
		if o.Limit < 0 {
			v.add(f+".limit", "must be positive, got %d", o.Limit)
		}
		if o.Burst < 0 {
			v.add(f+".burst", "must be positive, got %d", o.Burst)
		} else if o.Burst > 0 && o.Burst < maxCost {
			v.add(f+".burst", "%d is below the largest cost %d, so such a request could never pass", o.Burst, maxCost)
		}
		if o.Limit == 0 && o.Burst == 0 {
			v.add(f, "sets neither limit nor burst")
		}
		if o.Limit > 0 {
			v.rate(f+".limit", o.Limit, r.Window, algo)
		}
	}
}

// tiers checks the rule's tiers: at most MaxTiers, each with a unique name,
// a positive limit within the algorithm's rate bounds, and a burst at or
// above the rule's largest cost so that every request can still pass.
func (v *validator) tiers(p string, r *Rule, algo Algorithm) {
	if len(r.Tiers) > MaxTiers {
		v.add(p+".tiers", "%d tiers, at most %d per rule", len(r.Tiers), MaxTiers)
	}
	maxCost := r.maxCost()
	names := make(map[string]int, len(r.Tiers))
	for j, t := range r.Tiers {
		f := fmt.Sprintf("%s.tiers[%d]", p, j)
		if t.Name == "" {
			v.add(f+".name", "required")
		} else if k, dup := names[t.Name]; dup {
			v.add(f+".name", "duplicate tier %s, also in tiers[%d]", quote(t.Name), k)
		} else {
			names[t.Name] = j
		}
		if t.Limit <= 0 {
			v.add(f+".limit", "must be positive, got %d", t.Limit)
		} else {
			v.rate(f+".limit", t.Limit, r.Window, algo)
		}
		if t.Burst < 0 {
			v.add(f+".burst", "must be positive, got %d", t.Burst)
		} else if t.Burst > 0 && t.Burst < maxCost {
			v.add(f+".burst", "%d is below the largest cost %d, so such a request could never pass", t.Burst, maxCost)
		}
	}
}

// penalty checks a rule's penalty box: positive after, base and max, a
// non-negative within, and a base no longer than the max it doubles up to.
// f is the penalty's field path.
func (v *validator) penalty(f string, pen *Penalty) {
	if pen.After <= 0 {
		v.add(f+".after", "must be positive, got %d", pen.After)
	}
	if pen.Within < 0 {
		v.add(f+".within", "must be positive, got %s", pen.Within)
	}
	if pen.Base <= 0 {
		v.add(f+".base", "must be positive, got %s", pen.Base)
	}
	if pen.Max <= 0 {
		v.add(f+".max", "must be positive, got %s", pen.Max)
	}
	if pen.Base > 0 && pen.Max > 0 && pen.Base > pen.Max {
		v.add(f+".base", "%s is above max %s", pen.Base, pen.Max)
	}
}

// sketch checks a rule's sketch gating: shared gcra rules only (exact rules
// send every admission to the owner, local rules have no owner, durable
// counters must be exact), and its numbers in range.
func (v *validator) sketch(f string, r *Rule, algo Algorithm) {
	sk := r.Sketch
	switch {
	case algo != "" && algo != AlgorithmGCRA:
		v.add(f, "needs algorithm gcra and mode shared, not %s", algo)
	case r.Mode == ModeExact || r.Mode == ModeLocal:
		v.add(f, "needs mode shared, not %s (only shared rules admit within a slack)", r.Mode)
	case r.Durable:
		v.add(f, "contradicts durable (durable counters are exact)")
	}
	switch {
	case sk.Threshold < 1:
		v.add(f+".threshold", "must be at least 1, got %d", sk.Threshold)
	case sk.Threshold > MaxSketchThreshold:
		v.add(f+".threshold", "%d is above %d, the most a sketch counter holds", sk.Threshold, MaxSketchThreshold)
	}
	switch {
	case sk.Period < 0:
		v.add(f+".period", "must be positive, got %s", sk.Period)
	case sk.Period > 0 && r.Window > 0 && sk.Period < r.Window:
		v.add(f+".period", "%s is shorter than the window %s: the sketch would let threshold × nodes through more than once a window", sk.Period, r.Window)
	}
	if sk.Width < 0 || sk.Width > MaxSketchWidth {
		v.add(f+".width", "must be in [1, %d], got %d", MaxSketchWidth, sk.Width)
	}
	if sk.Depth < 0 || sk.Depth > MaxSketchDepth {
		v.add(f+".depth", "must be in [1, %d], got %d", MaxSketchDepth, sk.Depth)
	}
}

// rate checks that a positive limit is at most one per nanosecond of window
// and within the sliding log cap.
func (v *validator) rate(field string, limit int64, window time.Duration, algo Algorithm) {
	if limit <= 0 {
		return
	}
	if window > 0 && limit > int64(window) {
		v.add(field, "%d per %s is above one per nanosecond", limit, window)
	}
	if algo == AlgorithmSlidingLog && limit > MaxSlidingLogLimit {
		v.add(field, "%d is above %d, the most a sliding_log rule may hold", limit, MaxSlidingLogLimit)
	}
}

func (v *validator) match(p string, m *Match) {
	n := 0
	for _, s := range []string{m.Path, m.Prefix, m.Pattern} {
		if s != "" {
			n++
		}
	}
	if n > 1 {
		v.add(p, "set at most one of path, prefix and pattern")
	}
	if m.Path != "" && !strings.HasPrefix(m.Path, "/") {
		v.add(p+".path", `%s must start with "/"`, quote(m.Path))
	}
	if m.Prefix != "" && !strings.HasPrefix(m.Prefix, "/") {
		v.add(p+".prefix", `%s must start with "/"`, quote(m.Prefix))
	}
	if m.Pattern != "" {
		if _, msg := parsePattern(m.Pattern); msg != "" {
			v.add(p+".pattern", "%s: %s", quote(m.Pattern), msg)
		}
	}
	for j, meth := range m.Methods {
		if !validToken(meth) {
			v.add(fmt.Sprintf("%s.methods[%d]", p, j), "%s is not a valid HTTP method token", quote(meth))
		}
	}
}

func (v *validator) keys(p string, keys []KeySource) {
	seen := make(map[KeySource]int, len(keys))
	for j, k := range keys {
		f := fmt.Sprintf("%s[%d]", p, j)
		switch k.Kind {
		case KeyHeader:
			if k.Name == "" {
				v.add(f, "header key needs a name (header:X-API-Key)")
			} else if !validToken(k.Name) {
				v.add(f, "%s is not a valid header name", quote(k.Name))
			}
		case KeyUser, KeyIP, KeyGlobal:
			if k.Name != "" {
				v.add(f, "%s key takes no name, got %s", k.Kind, quote(k.Name))
			}
			if k.Kind == KeyGlobal && j != len(keys)-1 {
				v.add(f, "global always yields an identity, so it must be last in the chain")
			}
		default:
			v.add(f, "unknown key kind %s (want header:NAME, user, ip or global)", quote(string(k.Kind)))
		}
		nk := normalizeKey(k)
		if d, dup := seen[nk]; dup {
			v.add(f, "duplicate key source %s, also key[%d]", nk, d)
		} else {
			seen[nk] = j
		}
	}
}

// overrideSource checks an override's source against the rule's key chain
// and returns it in the form overrides are indexed by (rule.overrideSource).
func (v *validator) overrideSource(f string, r *Rule, src KeySource) KeySource {
	if src == (KeySource{}) {
		return src
	}
	ns := normalizeKey(src)
	chain := make([]string, 0, len(r.Key))
	for _, k := range r.Key {
		if nk := normalizeKey(k); nk.Kind != KeyGlobal {
			if nk == ns {
				return r.overrideSource(ns)
			}
			chain = append(chain, nk.String())
		}
	}
	switch {
	case ns.Kind == KeyGlobal:
		v.add(f, "global yields no identity of its own (every caller counts under one bucket), so no override can match it")
	case len(chain) == 0:
		v.add(f, "%s is not in the rule's key, which is [global]: an override needs a key source that yields identities", quote(ns.String()))
	default:
		v.add(f, "%s is not a source of the rule's key [%s]", quote(ns.String()), strings.Join(chain, ", "))
	}
	return ns
}

// validToken reports whether s is an RFC 9110 token (methods, header names).
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

func sortedKeys(m map[string]int64) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

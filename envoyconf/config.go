package envoyconf

import (
	"fmt"
	"hash/fnv"
	"regexp"
	"sort"
	"strings"

	"github.com/weir-dev/weir/quota"
)

// Options say how imported limits become weir rules. The zero Options is the
// default: GCRA rules in shared mode with burst = requests_per_unit, the
// default on_failure (local) and accuracy.
type Options struct {
	// Mode is every imported GCRA rule's mode: "" or shared (the default:
	// two-tier, within the accuracy contract) or exact (the identity's
	// owner decides every request: one network hop per request off the
	// owner).
	Mode quota.Mode
	// FixedWindow keeps envoyproxy/ratelimit's fixed windows for strict
	// fidelity: every limit becomes a fixed_window rule in exact mode, and
	// Mode is ignored. In a cluster the identity's owner counts the window
	// and decides every request (one network hop per request off the
	// owner), so the cluster admits R per window in all, as one counter in
	// Redis would; a join or a graceful leave hands the window's count to
	// the new owner, and an owner crash forgets it (docs/envoy.md).
	FixedWindow bool
	// Fidelity counts as envoyproxy/ratelimit counts, in its Redis: one
	// counter per descriptor's entries and unit window, to which every
	// request adds its hits, admitted or not, compared with the limit
	// after the addition. The rules are then one per unit
	// (Config.CounterRule): a fixed_window rule in exact mode that counts
	// rejected hits (quota.Rule.CountRejected), of FidelityCounterLimit per
	// window, which counts and never limits; the service (package rls)
	// compares each count with the descriptor's limit, the configured one
	// or the override Envoy sends. Mode, FixedWindow and Accuracy are
	// ignored (docs/envoy.md, "Fidelity mode").
	Fidelity bool
	// MergeDomains merges the files of one domain into one descriptor
	// tree, as envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG=true: a later
	// file's top-level descriptors join the domain's; one that repeats a
	// top-level key and value already loaded is an error. Without it two
	// files of one domain are an error.
	MergeDomains bool
	// OnFailure is every imported rule's on_failure; "" means local.
	OnFailure quota.OnFailure
	// Accuracy is every imported shared rule's accuracy; zero means
	// quota.DefaultAccuracy.
	Accuracy float64
	// RulePrefix starts every rule id; "" means "envoy.". Rule ids are
	// RulePrefix + domain + "." + the descriptor path, with characters
	// outside [A-Za-z0-9_.:-] replaced and a hash added when needed.
	RulePrefix string
}

// Limit is one compiled descriptor limit.
type Limit struct {
	// RuleID is the weir rule that counts this limit; empty when Unlimited
	// or Blocked (no rule counts them). Under Fidelity it is the counter
	// rule of the limit's unit (Config.CounterRule), Blocked limits
	// included.
	RuleID string
	// Name is the rate_limit's name ("" when none); Replaces the names it
	// replaces.
	Name     string
	Replaces []string
	// Unit and RequestsPerUnit are the limit as written.
	Unit            Unit
	RequestsPerUnit uint32
	// Unlimited: answer OK, count nothing.
	Unlimited bool
	// Blocked: requests_per_unit is 0, every request is over the limit
	// (counted by no rule).
	Blocked bool
	// Shadow: counted, never rejects.
	Shadow bool
	// Quota: quota_mode; over the limit the descriptor answers OK with
	// the limit and remaining but no duration until reset, and the
	// request is not over the limit for it (as envoyproxy/ratelimit).
	Quota bool
	// Domain is the limit's domain; StatsKey its descriptor path as
	// envoyproxy/ratelimit names it in its stats after the domain:
	// "key_value.key" for ratelimit.service.rate_limit.<domain>.key_value.key.total_hits
	// (":" and "|" become "_", and so do the dots of an IPv4 address, as
	// envoyproxy/ratelimit sanitizes stats names). It names the configured
	// path, never a request's values.
	Domain, StatsKey string
	// ValueStats: the limit's stats name takes a request's values, by
	// value_to_metric on a descriptor of its path or detailed_metric on
	// its own (Match.StatsKey).
	ValueStats bool
	// detailed: detailed_metric.
	detailed bool
}

// Entry is one entry of a descriptor Envoy sends.
type Entry struct{ Key, Value string }

// Match is the limit that applies to one descriptor and the identity of
// its bucket.
type Match struct {
	Limit *Limit
	// Identity is the descriptor's value path, "key=value/key=value" with
	// '%', '=' and '/' percent-escaped, so that distinct paths never share
	// a bucket. With share_threshold, a wildcard's pattern stands in for
	// the value.
	Identity string
	// StatsKey is the descriptor's stats name after the domain when
	// Limit.ValueStats, as envoyproxy/ratelimit builds it (sanitized as
	// Limit.StatsKey): with detailed_metric every entry's key_value; with
	// value_to_metric, the request's value at each level that has it and
	// matched by key alone or by a wildcard, the configured value at a
	// level that matched by value, the wildcard as written at a wildcard
	// level without it, and the key alone at a key-only level without it.
	// A share_threshold wildcard's pattern stands in for its values in
	// both. Empty when the limit's stats name is its configured path.
	StatsKey string
}

// Config is a compiled set of domains. It is immutable and safe for
// concurrent use.
type Config struct {
	domains map[string]*node
	rules   []quota.Rule
	limits  []*Limit // every limit, in file order
	// fidelity: Options.Fidelity; counters the counter rule ids by unit
	// (CounterRule), made once: the id is asked on every call.
	fidelity bool
	counters [UnitWeek + 1]string
}

type node struct {
	children map[string]*node
	wild     []wildChild // children whose composite key ends in "*", in file order
	limit    *Limit
	share    bool   // share_threshold
	pattern  string // the value as written (for share_threshold)
	v2m      bool   // value_to_metric
}

type wildChild struct {
	prefix string
	n      *node
}

// Compile turns parsed domains into weir rules and a matcher. Two files of
// one domain are an error (as in envoyproxy/ratelimit without merging),
// unless Options.MergeDomains. The
// rules are validated with quota.NewSet; errors name the file, line and
// field.
func Compile(opts Options, domains ...*Domain) (*Config, error) {
	if opts.RulePrefix == "" {
		opts.RulePrefix = "envoy."
	}
	c := &Config{domains: map[string]*node{}}
	var errs []error
	ids := map[string]string{} // rule id -> where it came from
	files := map[string]string{}
	for _, d := range domains {
		if d == nil {
			continue
		}
		root := c.domains[d.Name]
		if prev, dup := files[d.Name]; dup && !opts.MergeDomains {
			errs = append(errs, &quota.Error{File: d.File, Field: "domain", Msg: fmt.Sprintf("duplicate domain %q (also in %s)", d.Name, prev), Err: quota.ErrInvalidRule})
			continue
		} else if !dup {
			files[d.Name] = d.File
			root = &node{}
			c.domains[d.Name] = root
		}
		// v2m: value_to_metric on some descriptor of the path above.
		var walk func(parent *node, ds []*Descriptor, path string, v2m bool)
		walk = func(parent *node, ds []*Descriptor, path string, v2m bool) {
			for _, ds := range ds {
				ck := compositeKey(ds.Key, ds.Value)
				full := path + "." + ck
				if _, dup := parent.children[ck]; dup {
					// Only across merged files: Parse refuses duplicates within one.
					errs = append(errs, &quota.Error{File: d.File, Line: ds.Line, Field: ds.Field,
						Msg: fmt.Sprintf("duplicate descriptor %q in domain %q (also in %s)", ck, d.Name, files[d.Name]), Err: quota.ErrInvalidRule})
					continue
				}
				n := &node{share: ds.ShareThreshold, pattern: ds.Value, v2m: ds.ValueToMetric}
				if parent.children == nil {
					parent.children = map[string]*node{}
				}
				parent.children[ck] = n
				if strings.HasSuffix(ck, "*") {
					parent.wild = append(parent.wild, wildChild{prefix: strings.TrimSuffix(ck, "*"), n: n})
				}
				if rl := ds.RateLimit; rl != nil {
					lim := &Limit{Name: rl.Name, Replaces: rl.Replaces, Unit: rl.Unit, RequestsPerUnit: rl.RequestsPerUnit,
						Unlimited: rl.Unlimited, Blocked: !rl.Unlimited && rl.RequestsPerUnit == 0, Shadow: ds.ShadowMode,
						Quota:  ds.QuotaMode,
						Domain: d.Name, StatsKey: sanitizeStatName(full[1:]),
						ValueStats: ds.DetailedMetric || v2m || ds.ValueToMetric, detailed: ds.DetailedMetric}
					c.limits = append(c.limits, lim)
					if opts.Fidelity && !lim.Unlimited {
						lim.RuleID = counterRuleID(opts.RulePrefix, lim.Unit)
					} else if !lim.Unlimited && !lim.Blocked {
						lim.RuleID = ruleID(opts.RulePrefix, d.Name, full)
						where := fmt.Sprintf("%s:%d", d.File, ds.Line)
						if prev, dup := ids[lim.RuleID]; dup {
							errs = append(errs, &quota.Error{File: d.File, Line: ds.Line, Field: ds.Field,
								Msg: fmt.Sprintf("rule id %q is also made for %s; rename a descriptor", lim.RuleID, prev), Err: quota.ErrInvalidRule})
						} else {
							ids[lim.RuleID] = where
							r, err := rule(opts, lim, fmt.Sprintf("envoy domain %s descriptor %s (%s)", d.Name, full[1:], where))
							if err != nil {
								errs = append(errs, &quota.Error{File: d.File, Line: ds.Line, Field: ds.Field + ".rate_limit", Msg: err.Error(), Err: quota.ErrInvalidRule})
							} else {
								c.rules = append(c.rules, r)
							}
						}
					}
					n.limit = lim
				}
				walk(n, ds.Descriptors, full, v2m || ds.ValueToMetric)
			}
		}
		walk(root, d.Descriptors, "", false)
	}
	if opts.Fidelity {
		c.fidelity = true
		for _, u := range counterUnits {
			c.counters[u] = counterRuleID(opts.RulePrefix, u)
		}
		rules, err := counterRules(opts)
		if err != nil {
			errs = append(errs, err)
		}
		c.rules = rules
	}
	if len(errs) > 0 {
		return nil, joinErrors(errs)
	}
	sort.Slice(c.rules, func(i, j int) bool { return c.rules[i].ID < c.rules[j].ID })
	return c, nil
}

// rule builds and validates the weir rule of one limit.
func rule(opts Options, lim *Limit, desc string) (quota.Rule, error) {
	r := quota.Rule{
		ID:          lim.RuleID,
		Description: desc,
		Limit:       int64(lim.RequestsPerUnit),
		Window:      lim.Unit.Duration(),
		Burst:       int64(lim.RequestsPerUnit),
		Algorithm:   quota.AlgorithmGCRA,
		Mode:        opts.Mode,
		OnFailure:   opts.OnFailure,
		Accuracy:    opts.Accuracy,
		Shadow:      lim.Shadow,
	}
	if r.Mode == "" {
		r.Mode = quota.ModeShared
	}
	if opts.FixedWindow {
		r.Algorithm, r.Mode, r.Accuracy = quota.AlgorithmFixedWindow, quota.ModeExact, 0
	}
	if _, err := quota.NewSet([]quota.Rule{r}, 1); err != nil {
		return quota.Rule{}, err
	}
	return r, nil
}

// ruleID makes a valid, stable weir rule id for a descriptor path.
func ruleID(prefix, domain, path string) string {
	raw := prefix + domain + path
	var b strings.Builder
	clean := true
	for _, ch := range raw {
		switch {
		case ch >= 'a' && ch <= 'z', ch >= 'A' && ch <= 'Z', ch >= '0' && ch <= '9', ch == '_', ch == '.', ch == ':', ch == '-':
			b.WriteRune(ch)
		default:
			b.WriteByte('_')
			clean = false
		}
	}
	id := b.String()
	if clean && len(id) <= 128 {
		return id
	}
	h := fnv.New64a()
	h.Write([]byte(raw))
	sum := fmt.Sprintf("-%016x", h.Sum64())
	if len(id) > 128-len(sum) {
		id = id[:128-len(sum)]
	}
	return id + sum
}

// Rules returns the weir rules of every limit, sorted by id. The slice is a
// copy.
func (c *Config) Rules() []quota.Rule { return append([]quota.Rule(nil), c.rules...) }

// Limits returns every compiled limit (unlimited and blocked ones
// included), in file order. The slice is a copy; the limits are shared and
// must not be modified.
func (c *Config) Limits() []*Limit { return append([]*Limit(nil), c.limits...) }

// sanitizeStatName is envoyproxy/ratelimit's utils.SanitizeStatName: ":"
// and "|" become "_", and so do the dots inside anything shaped like an
// IPv4 address.
func sanitizeStatName(s string) string {
	s = strings.NewReplacer(":", "_", "|", "_").Replace(s)
	return ipv4Shape.ReplaceAllStringFunc(s, func(ip string) string { return strings.ReplaceAll(ip, ".", "_") })
}

var ipv4Shape = regexp.MustCompile(`\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}`)

// HasDomain reports whether the config has the domain.
func (c *Config) HasDomain(domain string) bool { _, ok := c.domains[domain]; return ok }

// Match finds the limit for one descriptor of a request in domain, the way
// envoyproxy/ratelimit does: at each level the entry's key_value is looked
// up, then the wildcard values of that level (in file order), then the key
// alone; a limit applies only when the descriptor ends at its node (a
// longer or shorter descriptor does not take it). ok is false when no limit
// applies (unknown domain, no match). Match does not apply replaces: that
// needs every descriptor of the request (see Replaced).
func (c *Config) Match(domain string, entries []Entry) (m Match, ok bool) {
	level := c.domains[domain]
	if level == nil || len(entries) == 0 {
		return Match{}, false
	}
	var id strings.Builder
	for i, e := range entries {
		ck := e.Key + "_" + e.Value
		next := level.children[ck]
		value := e.Value
		if next == nil {
			for _, w := range level.wild {
				if strings.HasPrefix(ck, w.prefix) {
					next = w.n
					if next.share {
						value = next.pattern
					}
					break
				}
			}
		}
		if next == nil {
			next = level.children[e.Key]
		}
		if i > 0 {
			id.WriteByte('/')
		}
		escape(&id, e.Key)
		id.WriteByte('=')
		escape(&id, value)
		if next == nil {
			return Match{}, false
		}
		if next.limit != nil && i == len(entries)-1 {
			m := Match{Limit: next.limit, Identity: id.String()}
			if m.Limit.ValueStats {
				m.StatsKey = c.statsKey(domain, entries)
			}
			return m, true
		}
		if len(next.children) == 0 {
			return Match{}, false
		}
		level = next
	}
	return Match{}, false
}

// statsKey is Match.StatsKey of entries, which match a limit with
// ValueStats in domain: the walk of Match again, writing each level's part
// of the name as envoyproxy/ratelimit's GetLimit does.
func (c *Config) statsKey(domain string, entries []Entry) string {
	level := c.domains[domain]
	var v2m strings.Builder
	shares := make([]string, len(entries)) // a share_threshold wildcard's pattern, by level
	shared := false
	for i, e := range entries {
		ck := e.Key + "_" + e.Value
		next, wild := level.children[ck], false
		if next == nil {
			for _, w := range level.wild {
				if strings.HasPrefix(ck, w.prefix) {
					next, wild = w.n, true
					break
				}
			}
		}
		byValue := next != nil
		if next == nil {
			next = level.children[e.Key]
		}
		if next == nil { // not reached: Match found a limit
			return ""
		}
		value := ""
		switch {
		case wild && next.share:
			value, shares[i], shared = next.pattern, next.pattern, true
		case wild && next.v2m:
			value = e.Value
		case wild:
			value = next.pattern
		case byValue, next.v2m:
			value = e.Value
		}
		if i > 0 {
			v2m.WriteByte('.')
		}
		v2m.WriteString(compositeKey(e.Key, value))
		level = next
	}
	if level.limit == nil || !level.limit.detailed {
		return sanitizeStatName(v2m.String())
	}
	// detailed_metric: every entry's key_value; when a level shares, that
	// level's pattern and the other levels' key alone for an empty value.
	var b strings.Builder
	for i, e := range entries {
		if i > 0 {
			b.WriteByte('.')
		}
		switch {
		case shares[i] != "":
			b.WriteString(e.Key + "_" + shares[i])
		case shared:
			b.WriteString(compositeKey(e.Key, e.Value))
		default:
			b.WriteString(e.Key + "_" + e.Value)
		}
	}
	return sanitizeStatName(b.String())
}

// Replaced reports, for the limits matched by one request's descriptors
// (nil where none matched), which are replaced by another matched limit:
// replaced[i] is true when some matched limit lists limits[i].Name in its
// replaces. A replaced limit is neither counted nor reported.
func Replaced(limits []*Limit) []bool {
	out := make([]bool, len(limits))
	names := map[string]bool{}
	for _, l := range limits {
		if l != nil {
			for _, r := range l.Replaces {
				names[r] = true
			}
		}
	}
	if len(names) == 0 {
		return out
	}
	for i, l := range limits {
		out[i] = l != nil && l.Name != "" && names[l.Name]
	}
	return out
}

// escape writes s with '%', '=' and '/' percent-escaped.
func escape(b *strings.Builder, s string) {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '%', '=', '/':
			fmt.Fprintf(b, "%%%02X", c)
		default:
			b.WriteByte(c)
		}
	}
}

// FidelityCounterLimit is the limit of each counter rule under
// Options.Fidelity: a count per window the counters never reach in
// practice (hits beyond it in one window are rejected, and counted).
const FidelityCounterLimit = 1_000_000_000

// counterUnits are the units of the counter rules, in the order of Unit.
var counterUnits = []Unit{UnitSecond, UnitMinute, UnitHour, UnitDay, UnitMonth, UnitYear, UnitWeek}

// counterRuleID is the id of the counter rule of unit u.
func counterRuleID(prefix string, u Unit) string { return prefix + "fidelity." + u.String() }

// counterRules are the counter rules of Options.Fidelity, one per unit.
func counterRules(opts Options) ([]quota.Rule, error) {
	var rules []quota.Rule
	for _, u := range counterUnits {
		rules = append(rules, quota.Rule{
			ID:          counterRuleID(opts.RulePrefix, u),
			Description: "envoy fidelity counter, per " + u.String() + " window (envoyproxy/ratelimit's Redis counters)",
			Limit:       FidelityCounterLimit, Window: u.Duration(), Burst: FidelityCounterLimit,
			Algorithm: quota.AlgorithmFixedWindow, Mode: quota.ModeExact, CountRejected: true, OnFailure: opts.OnFailure,
		})
	}
	if _, err := quota.NewSet(rules, 1); err != nil {
		return nil, fmt.Errorf("envoyconf: fidelity counter rules: %w", err)
	}
	return rules, nil
}

// Fidelity reports whether the config was compiled with Options.Fidelity.
func (c *Config) Fidelity() bool { return c.fidelity }

// CounterRule is the id of the counter rule of unit u under
// Options.Fidelity, or "" without it or for an invalid unit.
func (c *Config) CounterRule(u Unit) string {
	if !c.fidelity || u.Duration() == 0 {
		return ""
	}
	return c.counters[u]
}

// Identity is the value path of entries as Match.Identity writes it, with
// every value as sent (no share_threshold pattern): the counter of a
// descriptor Envoy sends with a limit override, which envoyproxy/ratelimit
// keys by the entries as sent.
func Identity(entries []Entry) string {
	var b strings.Builder
	for i, e := range entries {
		if i > 0 {
			b.WriteByte('/')
		}
		escape(&b, e.Key)
		b.WriteByte('=')
		escape(&b, e.Value)
	}
	return b.String()
}

// CounterKey is the key of a descriptor's counter under Options.Fidelity:
// its domain (escaped as in Identity) and its identity, so that the
// counters of two domains never meet, as envoyproxy/ratelimit's keys start
// with the domain.
func CounterKey(domain, identity string) string {
	var b strings.Builder
	escape(&b, domain)
	b.WriteByte('/')
	b.WriteString(identity)
	return b.String()
}

package quota

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
)

// Set is an immutable, validated, versioned list of rules with a compiled
// matcher. Rules are normalised: every default is filled in (Burst, Cost,
// Algorithm, Mode, Scope, OnFailure, Accuracy, Key, Penalty.Within,
// Sketch's Period, Width and Depth; a leaky_bucket rule's MaxDelay stays as
// given, see Rule.QueueDelay), methods are upper-cased and sorted, header
// names canonical and prefixes without a trailing "/". A Set is safe for concurrent use; the nil *Set is not
// usable.
type Set struct {
	version uint64
	digest  string
	rules   []Rule
	ids     map[string]int
	m       *matcher
	over    []map[overrideKey]int // by rule: override source and identity -> index
	tiers   []map[string]int      // by rule: tier name -> index
}

// NewSet validates rules, deep-copies and normalises them, and compiles the
// matcher. The version is the caller's (Holder numbers them from 1). On
// invalid rules it returns nil and every problem, joined (see Error).
func NewSet(rules []Rule, version uint64) (*Set, error) {
	if err := Validate(rules); err != nil {
		return nil, err
	}
	s := &Set{
		version: version,
		rules:   make([]Rule, len(rules)),
		ids:     make(map[string]int, len(rules)),
		over:    make([]map[overrideKey]int, len(rules)),
		tiers:   make([]map[string]int, len(rules)),
	}
	for i := range rules {
		r := normalize(rules[i])
		s.rules[i] = r
		s.ids[r.ID] = i
		if len(r.Overrides) > 0 {
			s.over[i] = make(map[overrideKey]int, len(r.Overrides))
			for j, o := range r.Overrides {
				s.over[i][overrideKey{o.Source, o.Identity}] = j
			}
		}
		if len(r.Tiers) > 0 {
			s.tiers[i] = make(map[string]int, len(r.Tiers))
			for j, t := range r.Tiers {
				s.tiers[i][t.Name] = j
			}
		}
	}
	s.digest = digest(s.rules)
	s.m = newMatcher(s.rules)
	return s, nil
}

// digest is the sha256 of the canonical JSON of normalised rules.
// encoding/json sorts map keys, so the form does not depend on map order.
func digest(rules []Rule) string {
	if rules == nil {
		rules = []Rule{}
	}
	b, err := json.Marshal(rules)
	if err != nil {
		// Only NaN or ±Inf accuracy could fail, and validation refuses them.
		panic("quota: canonical form: " + err.Error())
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// Version returns the version the set was created with.
func (s *Set) Version() uint64 { return s.version }

// Digest returns the hex sha256 of the set's canonical form. Two sets with
// the same normalised rules in the same order have the same digest,
// whatever their versions.
func (s *Set) Digest() string { return s.digest }

// Len returns the number of rules.
func (s *Set) Len() int { return len(s.rules) }

// Rules returns a deep copy of the normalised rules.
func (s *Set) Rules() []Rule {
	out := make([]Rule, len(s.rules))
	for i, r := range s.rules {
		out[i] = deepCopy(r)
	}
	return out
}

// Rule returns the rule at index i (its position in the set) as a read-only
// pointer: the caller must not modify it or its slices and maps. It panics
// if i is out of range, like a slice index.
func (s *Set) Rule(i int) *Rule { return &s.rules[i] }

// Lookup returns the index of the rule with the given id.
func (s *Set) Lookup(id string) (int, bool) {
	i, ok := s.ids[id]
	return i, ok
}

// Match appends to dst the indices of every rule that applies to a request
// with the given method and path, in rule order, and returns the extended
// slice. It does not allocate when dst has room for the result. The path is
// compared as given (see Match); a path not starting with "/" matches only
// rules without a path, prefix or pattern.
func (s *Set) Match(method, path string, dst []int) []int {
	return s.m.match(method, path, dst)
}

// overrideKey indexes a rule's overrides: the normalised source (zero for
// the chain's first source) and the identity.
type overrideKey struct {
	source   KeySource
	identity string
}

// LimitsFor is Rule(i).LimitsFor(identity, tier) with indexed lookups, for
// rules with many overrides.
func (s *Set) LimitsFor(i int, identity, tier string) (limit, burst int64) {
	return s.LimitsForSource(i, KeySource{}, identity, tier)
}

// LimitsForSource is Rule(i).LimitsForSource(source, identity, tier) with
// indexed lookups.
func (s *Set) LimitsForSource(i int, source KeySource, identity, tier string) (limit, burst int64) {
	r := &s.rules[i]
	var ov *Override
	if j, ok := s.over[i][overrideKey{r.overrideSource(source), identity}]; ok {
		ov = &r.Overrides[j]
	}
	var tr *Tier
	if j, ok := s.tiers[i][tier]; ok && tier != "" {
		tr = &r.Tiers[j]
	}
	return r.resolveLimits(ov, tr)
}

// deepCopy copies r and everything it references.
func deepCopy(r Rule) Rule {
	c := r
	if r.Match.Methods != nil {
		c.Match.Methods = append([]string(nil), r.Match.Methods...)
	}
	if r.Key != nil {
		c.Key = append([]KeySource(nil), r.Key...)
	}
	if r.CostByMethod != nil {
		c.CostByMethod = make(map[string]int64, len(r.CostByMethod))
		for k, v := range r.CostByMethod {
			c.CostByMethod[k] = v
		}
	}
	if r.Overrides != nil {
		c.Overrides = append([]Override(nil), r.Overrides...)
	}
	if r.EnforceRegions != nil {
		c.EnforceRegions = append([]string(nil), r.EnforceRegions...)
	}
	if r.Tiers != nil {
		c.Tiers = append([]Tier(nil), r.Tiers...)
	}
	if r.Penalty != nil {
		p := *r.Penalty
		c.Penalty = &p
	}
	if r.Sketch != nil {
		sk := *r.Sketch
		c.Sketch = &sk
	}
	return c
}

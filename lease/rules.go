package lease

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/weir-dev/weir/quota"
)

// This file is the rule store: the replicated, versioned rule set with its
// audit history, a pure state machine beside the lease Machine. A change is
// a RuleChange carrying the proposing leader's clock and the principal who
// asked for it; RuleStore.Apply validates the whole resulting set with
// quota's validation, hands the set's global rules to the lease Machine in
// the same step, and only then commits, so the rule set, its history and
// the machine's rules move together or not at all.

// MaxHistory is how many audit entries the rule store keeps: the newest
// MaxHistory; older ones are dropped as new ones arrive (10 000 changes of
// rules that change a few times a day are years of history). The history
// is part of every snapshot, so it is bounded.
const MaxHistory = 10000

// Bounds of a rule change's strings.
const (
	// MaxPrincipalBytes is the longest principal a rule change may carry.
	MaxPrincipalBytes = 256
	// MaxRequestIDBytes is the longest request id a rule change may carry.
	MaxRequestIDBytes = 64
)

// ErrRuleNotFound: the rule store has no rule with that id (a delete or a
// read of an unknown id).
var ErrRuleNotFound = errors.New("lease: no such rule")

// RuleOp is the kind of a rule change.
type RuleOp uint8

// The rule changes.
const (
	// OpPut creates a rule or replaces the rule with the same id.
	OpPut RuleOp = 1
	// OpDelete deletes a rule.
	OpDelete RuleOp = 2
)

// String returns "put" or "delete".
func (o RuleOp) String() string {
	switch o {
	case OpPut:
		return "put"
	case OpDelete:
		return "delete"
	}
	return fmt.Sprintf("RuleOp(%d)", uint8(o))
}

// ParseRuleOp is String's inverse.
func ParseRuleOp(s string) (RuleOp, bool) {
	switch s {
	case "put":
		return OpPut, true
	case "delete":
		return OpDelete, true
	}
	return 0, false
}

// RuleChange is one change of the rule store, an entry of the replicated
// log: exactly one of Put and Delete is set.
type RuleChange struct {
	// Now is the proposing leader's clock (unix ns): the change's audit
	// time. raftgroup.Group stamps it; a caller's value is overwritten.
	Now int64
	// Principal names who asked for the change (a token's principal, a
	// client certificate's subject); required, at most MaxPrincipalBytes.
	Principal string
	// RequestID names the request across retries (at most
	// MaxRequestIDBytes; empty: none). A change whose RequestID is already
	// in the history is a retry of that change: it is not applied again,
	// and Apply returns that entry's version. raftgroup.Group and Client draw one
	// per call, before they retry.
	RequestID string
	// Put creates the rule Put.ID or replaces it.
	Put *quota.Rule
	// Delete is the id of the rule to delete.
	Delete string
}

// AuditEntry records one accepted change of the rule store.
type AuditEntry struct {
	// Version is the rule store's version after the change.
	Version uint64
	// At is when the leader proposed it, unix ns, on the leader's clock
	// (never before the previous entry's At).
	At int64
	// Principal is who asked for it; RequestID the request's id.
	Principal, RequestID string
	// Op is put or delete; RuleID the rule it changed.
	Op     RuleOp
	RuleID string
	// Before and After are the rule before and after the change, each the
	// canonical JSON of the normalised quota.Rule (encoding/json of the Go
	// struct, the form quota's digest hashes); nil when there is none (a
	// put that created the rule; a delete). Decode them with Rules.
	Before, After []byte
	// Digest is quota's digest of the whole rule set after the change.
	Digest string
}

// Rules decodes Before and After; a nil pointer means none.
func (e AuditEntry) Rules() (before, after *quota.Rule, err error) {
	dec := func(b []byte) (*quota.Rule, error) {
		if b == nil {
			return nil, nil
		}
		r, err := DecodeRuleJSON(b)
		if err != nil {
			return nil, err
		}
		return &r, nil
	}
	if before, err = dec(e.Before); err != nil {
		return nil, nil, fmt.Errorf("lease: audit entry %d: before: %w", e.Version, err)
	}
	if after, err = dec(e.After); err != nil {
		return nil, nil, fmt.Errorf("lease: audit entry %d: after: %w", e.Version, err)
	}
	return before, after, nil
}

func (e AuditEntry) clone() AuditEntry {
	e.Before, e.After = bytes.Clone(e.Before), bytes.Clone(e.After)
	return e
}

// RuleStore is the replicated rule set: its version, its rules (ordered by
// id) and the newest MaxHistory audit entries. Its zero value is not
// usable: NewRuleStore returns an empty store (version 0, no rules). It is
// not safe for concurrent use; the FSM guards it.
type RuleStore struct {
	version uint64
	set     *quota.Set // normalised rules, ordered by id
	raw     [][]byte   // the canonical JSON of set.Rule(i)
	history []AuditEntry
}

// NewRuleStore returns an empty rule store.
func NewRuleStore() *RuleStore {
	s, err := quota.NewSet(nil, 0)
	if err != nil {
		panic("lease: an empty quota set is invalid: " + err.Error())
	}
	return &RuleStore{set: s}
}

// Version is the number of changes applied: 0 for a store that was never
// changed.
func (s *RuleStore) Version() uint64 { return s.version }

// Digest is quota's digest of the current rule set.
func (s *RuleStore) Digest() string { return s.set.Digest() }

// Rules returns a deep copy of the rules, normalised, ordered by id.
func (s *RuleStore) Rules() []quota.Rule { return s.set.Rules() }

// Rule returns a deep copy of the rule id.
func (s *RuleStore) Rule(id string) (quota.Rule, bool) {
	i, ok := s.set.Lookup(id)
	if !ok {
		return quota.Rule{}, false
	}
	r, err := DecodeRuleJSON(s.raw[i])
	if err != nil {
		panic("lease: a stored rule does not decode: " + err.Error())
	}
	return r, true
}

// Oldest is the version of the oldest audit entry kept, 0 when there is
// none.
func (s *RuleStore) Oldest() uint64 {
	if len(s.history) == 0 {
		return 0
	}
	return s.history[0].Version
}

// History returns copies of the audit entries newer than since, oldest
// first, at most limit of them (limit ≤ 0: all). Entries older than Oldest
// are gone.
func (s *RuleStore) History(since uint64, limit int) []AuditEntry {
	i := sort.Search(len(s.history), func(i int) bool { return s.history[i].Version > since })
	out := s.history[i:]
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	cp := make([]AuditEntry, len(out))
	for j, e := range out {
		cp[j] = e.clone()
	}
	return cp
}

// LeaseRules returns the lease Machine's view of the set's global rules
// (scope: global), ordered by id.
func (s *RuleStore) LeaseRules() []Rule {
	out := []Rule{}
	for i := range s.set.Len() {
		if r := s.set.Rule(i); r.Scope == quota.ScopeGlobal {
			out = append(out, leaseRule(*r))
		}
	}
	return out
}

// leaseRule derives what the lease Machine needs of a normalised global
// rule: its limit, window and burst, and the largest cost one request can
// charge (Cost, or the largest CostByMethod entry; overrides and tiers
// carry no cost).
func leaseRule(r quota.Rule) Rule {
	maxCost := r.CostFor("")
	for _, c := range r.CostByMethod {
		maxCost = max(maxCost, c)
	}
	return Rule{ID: r.ID, Limit: r.Limit, Window: r.Window, Burst: r.Burst, MaxCost: maxCost}
}

// Apply applies one change and returns the store's version after it. m,
// when not nil, is the lease Machine beside the store: the resulting set's
// global rules are applied to it in the same step (Command{Now, Rules}),
// and a rule it cannot lease refuses the change.
//
// A put creates or replaces the rule Put.ID; a put equal (once normalised)
// to the rule in force changes nothing and returns the current version, so
// a retried put is harmless. A delete of an unknown id is refused with
// ErrRuleNotFound (also when a retried delete already took effect). An
// invalid resulting set is refused with the joined *quota.Error values
// (errors.Is quota.ErrInvalidRule), their Field paths relative to the rule
// ("window", "overrides[0].burst"), so that they name the field as the
// caller wrote it; a global rule the machine cannot lease is refused the
// same way, naming the field to change. A change with no principal, or
// with neither or both of Put and Delete, is refused with ErrBadCommand.
// On any refusal nothing changes: not the rules, the version, the history
// or the machine.
//
// Every accepted change bumps the version by one and appends an audit
// entry at max(c.Now, the previous entry's At), dropping the oldest entry
// beyond MaxHistory. A change whose RequestID is in the history already
// changes nothing and returns that entry's version: a retry of a change
// whose reply was lost (a leader change, a forward that timed out) is
// harmless, a delete included, for as long as the history holds the entry.
func (s *RuleStore) Apply(m *Machine, c RuleChange) (uint64, error) {
	if err := c.Check(); err != nil {
		return s.version, err
	}
	if c.RequestID != "" {
		for i := len(s.history) - 1; i >= 0; i-- {
			if s.history[i].RequestID == c.RequestID {
				return s.history[i].Version, nil
			}
		}
	}
	rules := s.set.Rules()
	var (
		op     RuleOp
		id     string
		before []byte
		at     = -1 // the changed rule's index in the new set; -1 for a delete
	)
	if c.Put != nil {
		op, id = OpPut, c.Put.ID
		i, found := slices.BinarySearchFunc(rules, id, func(r quota.Rule, id string) int { return strings.Compare(r.ID, id) })
		if found {
			before = s.raw[i]
			rules[i] = *c.Put
		} else {
			rules = slices.Insert(rules, i, *c.Put)
		}
		at = i
	} else {
		op, id = OpDelete, c.Delete
		i, found := s.set.Lookup(id)
		if !found {
			return s.version, fmt.Errorf("%w: %q", ErrRuleNotFound, id)
		}
		before = s.raw[i]
		rules = slices.Delete(rules, i, i+1)
	}
	next, err := quota.NewSet(rules, s.version+1)
	if err != nil {
		return s.version, ruleErrors(op, id, err, at)
	}
	raw := make([][]byte, next.Len())
	for i := range raw {
		if raw[i], err = EncodeRuleJSON(*next.Rule(i)); err != nil {
			return s.version, fmt.Errorf("lease: rule %q: %w", next.Rule(i).ID, err)
		}
	}
	var after []byte
	if at >= 0 {
		after = raw[at]
		if bytes.Equal(after, before) {
			return s.version, nil // the rule in force already
		}
		if err := leasable(m, *next.Rule(at)); err != nil {
			return s.version, ruleErrors(op, id, err, at)
		}
	}
	ns := &RuleStore{version: s.version + 1, set: next, raw: raw}
	if m != nil {
		if _, err := m.Apply(Command{Now: c.Now, Rules: ns.LeaseRules()}); err != nil {
			return s.version, fmt.Errorf("lease: %s rule %q: the lease machine refused the rule set: %w", op, id, err)
		}
	}
	when := c.Now
	if n := len(s.history); n > 0 {
		when = max(when, s.history[n-1].At)
	}
	e := AuditEntry{Version: ns.version, At: when, Principal: c.Principal, RequestID: c.RequestID, Op: op, RuleID: id,
		Before: before, After: after, Digest: next.Digest()}
	s.version, s.set, s.raw = ns.version, ns.set, ns.raw
	if len(s.history) >= MaxHistory {
		// Drop the oldest; copy so the backing array does not grow
		// without bound.
		s.history = slices.Clone(s.history[len(s.history)-MaxHistory+1:])
	}
	s.history = append(s.history, e)
	return s.version, nil
}

// Check checks a change's form: exactly one of Put and Delete, a principal,
// valid UTF-8 and the size limits. Errors wrap ErrBadCommand. It does not
// validate the rule itself (Validate does).
func (c RuleChange) Check() error {
	switch {
	case (c.Put == nil) == (c.Delete == ""):
		return fmt.Errorf("%w: a rule change must set exactly one of put and delete", ErrBadCommand)
	case c.Principal == "":
		return fmt.Errorf("%w: a rule change needs a principal", ErrBadCommand)
	case len(c.Principal) > MaxPrincipalBytes:
		return fmt.Errorf("%w: principal of %d bytes, over %d", ErrBadCommand, len(c.Principal), MaxPrincipalBytes)
	case !utf8.ValidString(c.Principal):
		return fmt.Errorf("%w: principal is not valid UTF-8", ErrBadCommand)
	case !utf8.ValidString(c.Delete):
		return fmt.Errorf("%w: the rule id to delete is not valid UTF-8", ErrBadCommand)
	case len(c.RequestID) > MaxRequestIDBytes:
		return fmt.Errorf("%w: request id of %d bytes, over %d", ErrBadCommand, len(c.RequestID), MaxRequestIDBytes)
	}
	return nil
}

// Validate checks a change's form (Check) and, for a put, the rule on its
// own (quota.Validate, with fields relative to the rule), which is what a
// proposer checks before a round trip; RuleStore.Apply checks the rule
// again within the set, and whether the Machine can lease it.
func (c RuleChange) Validate() error {
	if err := c.Check(); err != nil {
		return err
	}
	if c.Put == nil {
		return nil
	}
	if err := quota.Validate([]quota.Rule{*c.Put}); err != nil {
		return ruleErrors(OpPut, c.Put.ID, err, 0)
	}
	return nil
}

// leasable reports, as a *quota.Error naming the field to change, why the
// lease Machine cannot lease a normalised global rule; nil for rules of
// region scope, and when m is nil.
func leasable(m *Machine, r quota.Rule) error {
	if m == nil || r.Scope != quota.ScopeGlobal {
		return nil
	}
	bad := func(field, format string, args ...any) error {
		return &quota.Error{Field: field, Msg: fmt.Sprintf(format, args...), RuleID: r.ID, Err: quota.ErrInvalidRule}
	}
	// The machine leases one limit per rule: an identity's own limit
	// would be shared out as if it were the rule's.
	if len(r.Overrides) > 0 {
		return bad("overrides", "not supported with scope global: the lease group leases one limit per global rule")
	}
	if len(r.Tiers) > 0 {
		return bad("tiers", "not supported with scope global: the lease group leases one limit per global rule")
	}
	lr := leaseRule(r)
	if err := m.ValidateRule(lr); err != nil {
		n := int64(len(m.cfg.Regions))
		if lr.Burst/n < lr.MaxCost {
			return bad("burst", "%d shared by %d regions leaves a region's share a burst of %d, below the largest cost %d: raise burst to at least %d or lower the cost",
				lr.Burst, n, lr.Burst/n, lr.MaxCost, n*lr.MaxCost)
		}
		return bad("", "the lease group cannot lease it: %v", err)
	}
	return nil
}

// ruleErrors rewrites the *quota.Error values in err (from validating a
// set in which the changed rule is at index at, -1 for none) so that fields
// are relative to their rule ("rules[3].window" → "window", the rule named
// by RuleID), and wraps them, joined, with the change. An err with no
// *quota.Error inside is wrapped as it is.
func ruleErrors(op RuleOp, id string, err error, at int) error {
	probs := Problems(err)
	if len(probs) == 0 {
		return fmt.Errorf("lease: %s rule %q refused: %w", op, id, err)
	}
	out := make([]error, len(probs))
	for i, qe := range probs {
		cp := *qe
		cp.Field, cp.Line = RelativeField(qe.Field), 0
		if cp.RuleID == "" && at >= 0 && strings.HasPrefix(qe.Field, fmt.Sprintf("rules[%d]", at)) {
			cp.RuleID = id
		}
		out[i] = &cp
	}
	return fmt.Errorf("lease: %s rule %q refused: %w", op, id, errors.Join(out...))
}

// RelativeField strips a leading "rules[N]" and the dot after it: a field
// of a set made relative to its rule.
func RelativeField(f string) string {
	if !strings.HasPrefix(f, "rules[") {
		return f
	}
	i := strings.IndexByte(f, ']')
	if i < 0 {
		return f
	}
	return strings.TrimPrefix(f[i+1:], ".")
}

// Problems returns every *quota.Error in err's tree (errors.Join and %w
// wrapping included), in order; nil when there is none.
func Problems(err error) []*quota.Error {
	var out []*quota.Error
	var walk func(error)
	walk = func(err error) {
		switch e := err.(type) {
		case nil:
		case *quota.Error:
			out = append(out, e)
		case interface{ Unwrap() []error }:
			for _, x := range e.Unwrap() {
				walk(x)
			}
		case interface{ Unwrap() error }:
			walk(e.Unwrap())
		}
	}
	walk(err)
	return out
}

// EncodeRuleJSON is a rule's canonical JSON: encoding/json of the Go
// struct (map keys sorted), the form quota's digest hashes.
func EncodeRuleJSON(r quota.Rule) ([]byte, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encoding rule %q: %w", r.ID, err)
	}
	return b, nil
}

// DecodeRuleJSON reads EncodeRuleJSON's form strictly: one JSON object,
// no unknown fields, nothing after it.
func DecodeRuleJSON(b []byte) (quota.Rule, error) {
	if t := bytes.TrimLeft(b, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return quota.Rule{}, errors.New("a rule must be a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var r quota.Rule
	if err := dec.Decode(&r); err != nil {
		return quota.Rule{}, fmt.Errorf("decoding a rule: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return quota.Rule{}, errors.New("decoding a rule: data after the object")
	}
	return r, nil
}

package lease

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/weir-dev/weir/quota"
)

// These tests drive the pure rule store (rules.go) and its place in the
// FSM, the codec and the snapshot, with no Raft.

func emptyMachine(t testing.TB) *Machine {
	t.Helper()
	m, err := NewMachine(Config{Regions: []string{"ap", "eu", "us"}, LeaseDuration: 10 * time.Second, MaxSkew: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

var (
	searchRule = quota.Rule{ID: "search", Limit: 100, Window: time.Minute, Burst: 20,
		Key: []quota.KeySource{{Kind: quota.KeyHeader, Name: "X-Api-Key"}}, Match: quota.Match{Prefix: "/search"}}
	globalRule = quota.Rule{ID: "cust-global", Limit: 10000, Window: time.Minute, Burst: 600, Cost: 2,
		CostByMethod: map[string]int64{"POST": 5}, Scope: quota.ScopeGlobal}
)

func mustApply(t testing.TB, s *RuleStore, m *Machine, c RuleChange) uint64 {
	t.Helper()
	v, err := s.Apply(m, c)
	if err != nil {
		t.Fatalf("apply %+v: %v", c, err)
	}
	return v
}

// fields lists the Field of every *quota.Error in err.
func fields(err error) []string {
	var out []string
	for _, q := range Problems(err) {
		out = append(out, q.Field)
	}
	return out
}

// TestRuleStoreChanges: puts create and replace, deletes remove; each
// accepted change bumps the version by one and records who, when, what
// before and after, and the set's digest; an equal put changes nothing.
func TestRuleStoreChanges(t *testing.T) {
	s, m := NewRuleStore(), emptyMachine(t)
	if v := mustApply(t, s, m, RuleChange{Now: 100, Principal: "alice", Put: &searchRule}); v != 1 {
		t.Fatalf("version %d after the first put", v)
	}
	wider := searchRule
	wider.Limit = 200
	if v := mustApply(t, s, m, RuleChange{Now: 200, Principal: "bob", Put: &wider}); v != 2 {
		t.Fatalf("version %d after the replace", v)
	}
	// Equal once normalised (burst 20 written out, methods upper-cased):
	// no change, no entry.
	same := wider
	same.Cost = 1
	if v := mustApply(t, s, m, RuleChange{Now: 250, Principal: "carol", Put: &same}); v != 2 {
		t.Fatalf("an equal put moved the version to %d", v)
	}
	mustApply(t, s, m, RuleChange{Now: 150, Principal: "alice", Put: &globalRule}) // a clock behind
	if v := mustApply(t, s, m, RuleChange{Now: 400, Principal: "dave", Delete: "search"}); v != 4 {
		t.Fatalf("version %d after the delete", v)
	}
	if _, ok := s.Rule("search"); ok {
		t.Fatal("the deleted rule is still there")
	}
	h := s.History(0, 0)
	want := []struct {
		v         uint64
		at        int64
		who, op   string
		id        string
		hasBefore bool
		hasAfter  bool
	}{
		{1, 100, "alice", "put", "search", false, true},
		{2, 200, "bob", "put", "search", true, true},
		{3, 200, "alice", "put", "cust-global", false, true}, // never before the previous entry
		{4, 400, "dave", "delete", "search", true, false},
	}
	if len(h) != len(want) {
		t.Fatalf("%d history entries, want %d", len(h), len(want))
	}
	for i, w := range want {
		e := h[i]
		if e.Version != w.v || e.At != w.at || e.Principal != w.who || e.Op.String() != w.op || e.RuleID != w.id ||
			(e.Before != nil) != w.hasBefore || (e.After != nil) != w.hasAfter {
			t.Errorf("entry %d: %+v, want %+v", i, e, w)
		}
	}
	before, after, err := h[1].Rules()
	if err != nil || before.Limit != 100 || after.Limit != 200 || after.Burst != 20 {
		t.Fatalf("entry 2 rules: %+v %+v %v", before, after, err)
	}
	if h[3].Digest != s.Digest() {
		t.Fatal("the last entry's digest is not the set's")
	}
	set, err := quota.NewSet([]quota.Rule{globalRule}, 4)
	if err != nil || set.Digest() != s.Digest() {
		t.Fatalf("the store's digest is not quota's for the same rules: %v", err)
	}
	if got := s.History(2, 1); len(got) != 1 || got[0].Version != 3 {
		t.Fatalf("History(2, 1) = %+v", got)
	}
	if got := s.History(4, 0); len(got) != 0 {
		t.Fatalf("History(4) = %+v", got)
	}
	// A returned entry is a copy.
	h[0].After[0] = 'X'
	if s.History(0, 1)[0].After[0] == 'X' {
		t.Fatal("History shares bytes with the store")
	}
}

// TestRuleStoreRefusals: an invalid put, a delete of an unknown id and a
// malformed change are refused with errors naming the field, and change
// nothing: not the rules, the version, the history or the machine.
func TestRuleStoreRefusals(t *testing.T) {
	s, m := NewRuleStore(), emptyMachine(t)
	mustApply(t, s, m, RuleChange{Now: 1, Principal: "alice", Put: &searchRule})
	mustApply(t, s, m, RuleChange{Now: 2, Principal: "alice", Put: &globalRule})
	before, mBefore := marshalState(m, s), m.MarshalState()

	bad := searchRule
	bad.Window = 0
	bad.Overrides = []quota.Override{{Identity: "vip"}}
	badCost := globalRule
	badCost.CostByMethod = map[string]int64{"POST": 601}
	// Burst 5 over 3 regions leaves each a burst of 1, below the cost 2.
	unleasable := globalRule
	unleasable.Burst, unleasable.CostByMethod = 5, nil
	withTiers := globalRule
	withTiers.Tiers = []quota.Tier{{Name: "gold", Limit: 20000}}
	for _, tc := range []struct {
		name   string
		c      RuleChange
		is     error
		fields []string
	}{
		{"invalid put", RuleChange{Principal: "eve", Put: &bad}, quota.ErrInvalidRule, []string{"window", "overrides[0]"}},
		{"cost over burst", RuleChange{Principal: "eve", Put: &badCost}, quota.ErrInvalidRule, []string{"cost_by_method.POST"}},
		{"global burst below the cost", RuleChange{Principal: "eve", Put: &unleasable}, quota.ErrInvalidRule, []string{"burst"}},
		{"global with tiers", RuleChange{Principal: "eve", Put: &withTiers}, quota.ErrInvalidRule, []string{"tiers"}},
		{"unknown id", RuleChange{Principal: "eve", Delete: "nope"}, ErrRuleNotFound, nil},
		{"no principal", RuleChange{Put: &searchRule}, ErrBadCommand, nil},
		{"both kinds", RuleChange{Principal: "eve", Put: &searchRule, Delete: "search"}, ErrBadCommand, nil},
		{"neither kind", RuleChange{Principal: "eve"}, ErrBadCommand, nil},
	} {
		v, err := s.Apply(m, tc.c)
		if !errors.Is(err, tc.is) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.is)
		}
		if v != 2 {
			t.Errorf("%s: version %d returned", tc.name, v)
		}
		if got := fields(err); strings.Join(got, ",") != strings.Join(tc.fields, ",") {
			t.Errorf("%s: fields %q, want %q (%v)", tc.name, got, tc.fields, err)
		}
		for _, q := range Problems(err) {
			if q.RuleID == "" || q.Line != 0 {
				t.Errorf("%s: problem %+v does not name its rule", tc.name, q)
			}
		}
		if !bytes.Equal(marshalState(m, s), before) || !bytes.Equal(m.MarshalState(), mBefore) {
			t.Fatalf("%s: a refused change changed the state", tc.name)
		}
	}
	// The message names the field as the caller wrote it.
	_, err := s.Apply(m, RuleChange{Principal: "eve", Put: &unleasable})
	if !strings.Contains(err.Error(), "burst: 5 shared by 3 regions") || !strings.Contains(err.Error(), `rule "cust-global"`) {
		t.Fatalf("message %q", err)
	}
}

// TestRuleStoreRetries: a change whose request id is in the history is a
// retry: it is not applied again, and returns the version it was applied
// at, even after later changes; a delete retried after it took effect is
// not refused as unknown.
func TestRuleStoreRetries(t *testing.T) {
	s, m := NewRuleStore(), emptyMachine(t)
	mustApply(t, s, m, RuleChange{Now: 1, Principal: "a", RequestID: "put-1", Put: &searchRule})
	mustApply(t, s, m, RuleChange{Now: 2, Principal: "a", RequestID: "put-2", Put: &globalRule})
	if v := mustApply(t, s, m, RuleChange{Now: 3, Principal: "b", RequestID: "del-1", Delete: "search"}); v != 3 {
		t.Fatalf("delete at %d", v)
	}
	before := marshalState(m, s)
	if v := mustApply(t, s, m, RuleChange{Now: 4, Principal: "b", RequestID: "del-1", Delete: "search"}); v != 3 {
		t.Fatalf("a retried delete returned %d", v)
	}
	if v := mustApply(t, s, m, RuleChange{Now: 5, Principal: "a", RequestID: "put-1", Put: &searchRule}); v != 1 {
		t.Fatalf("a retried put returned %d", v)
	}
	if !bytes.Equal(marshalState(m, s), before) {
		t.Fatal("a retry changed the store")
	}
	// Without a request id, the second delete is a new request.
	if _, err := s.Apply(m, RuleChange{Now: 6, Principal: "b", Delete: "search"}); !errors.Is(err, ErrRuleNotFound) {
		t.Fatalf("a new delete of a deleted rule: %v", err)
	}
	if _, err := s.Apply(m, RuleChange{Principal: "b", RequestID: strings.Repeat("x", MaxRequestIDBytes+1), Delete: "x"}); !errors.Is(err, ErrBadCommand) {
		t.Fatalf("an overlong request id: %v", err)
	}
}

// TestRuleStoreFeedsMachine: the set's global rules reach the lease
// Machine in the same step (limit, window, burst, and the largest cost of
// Cost and CostByMethod); deleting one removes it; region rules never
// reach it; and once the store has a version, a raw Command{Rules} is
// refused so the two cannot disagree.
func TestRuleStoreFeedsMachine(t *testing.T) {
	f := NewReplica(emptyMachine(t))
	apply := func(e Entry) ApplyResponse {
		t.Helper()
		var b []byte
		var err error
		if e.Rule != nil {
			b, err = EncodeRuleChange(*e.Rule)
		} else {
			b, err = EncodeEntry(*e.Command)
		}
		if err != nil {
			t.Fatal(err)
		}
		return f.Apply(b)
	}
	// Before the store is used, a raw rule set is accepted (the machine's
	// rules may come from elsewhere).
	if r := apply(Entry{Command: &Command{Now: 1, Rules: []Rule{testRule}}}); r.Err != nil {
		t.Fatal(r.Err)
	}
	if r := apply(Entry{Rule: &RuleChange{Now: 2, Principal: "a", Put: &searchRule}}); r.Err != nil || r.RuleVersion != 1 {
		t.Fatalf("%+v", r)
	}
	if got := f.LeaseRules(); len(got) != 0 {
		t.Fatalf("the store took over the machine's rules; want none (no global rule), got %+v", got)
	}
	if r := apply(Entry{Rule: &RuleChange{Now: 3, Principal: "a", Put: &globalRule}}); r.Err != nil || r.RuleVersion != 2 {
		t.Fatalf("%+v", r)
	}
	want := Rule{ID: "cust-global", Limit: 10000, Window: time.Minute, Burst: 600, MaxCost: 5}
	if got := f.LeaseRules(); len(got) != 1 || got[0] != want {
		t.Fatalf("machine rules %+v, want %+v", got, want)
	}
	// A region of the machine can now report on the global rule.
	res := apply(Entry{Command: &Command{Now: 4, Report: &Report{Reporter: "eu-1", Seq: 1, Region: "eu",
		Items: []ReportItem{{Rule: "cust-global", Identity: "cust", Demand: 4000}}}}})
	if res.Err != nil || len(res.Result.Grants) != 1 || res.Result.Grants[0].Share != 4000 {
		t.Fatalf("report on the stored global rule: %+v", res)
	}
	if r := apply(Entry{Command: &Command{Now: 5, Rules: []Rule{testRule}}}); !errors.Is(r.Err, ErrBadCommand) {
		t.Fatalf("a raw rule set after the store took over: %v", r.Err)
	}
	if r := apply(Entry{Rule: &RuleChange{Now: 6, Principal: "a", Delete: "cust-global"}}); r.Err != nil || r.RuleVersion != 3 {
		t.Fatalf("%+v", r)
	}
	if got := f.LeaseRules(); len(got) != 0 {
		t.Fatalf("machine rules %+v after the delete", got)
	}
	if err := f.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestRuleStoreHistoryBound: the history keeps the newest MaxHistory
// entries; the version keeps counting.
func TestRuleStoreHistoryBound(t *testing.T) {
	s := NewRuleStore()
	r := searchRule
	for i := range MaxHistory + 5 {
		r.Limit = int64(100 + i%2)
		mustApply(t, s, nil, RuleChange{Now: int64(i), Principal: "p", Put: &r})
	}
	h := s.History(0, 0)
	if len(h) != MaxHistory || s.Version() != MaxHistory+5 || s.Oldest() != 6 || h[0].Version != 6 {
		t.Fatalf("%d entries, version %d, oldest %d", len(h), s.Version(), s.Oldest())
	}
	if cap(s.history) > 2*MaxHistory {
		t.Fatalf("the history's array grew to %d", cap(s.history))
	}
}

// genRuleChange draws a rule change over a few ids, valid or not.
func genRuleChange(t *rapid.T) RuleChange {
	c := RuleChange{Now: rapid.Int64Range(0, 1e12).Draw(t, "now"), Principal: rapid.SampledFrom([]string{"alice", "bob", ""}).Draw(t, "principal"),
		RequestID: rapid.SampledFrom([]string{"", "r1", "r2", "r3"}).Draw(t, "request id")}
	id := rapid.SampledFrom([]string{"a", "b", "c", "d"}).Draw(t, "id")
	if rapid.IntRange(0, 3).Draw(t, "op") == 0 {
		c.Delete = id
		return c
	}
	r := quota.Rule{ID: id, Limit: rapid.Int64Range(-1, 3000).Draw(t, "limit"), Window: time.Duration(rapid.IntRange(0, 3).Draw(t, "window")) * time.Second,
		Burst: rapid.Int64Range(0, 300).Draw(t, "burst"), Cost: rapid.Int64Range(0, 40).Draw(t, "cost")}
	if rapid.Bool().Draw(t, "global") {
		r.Scope = quota.ScopeGlobal
	}
	if rapid.Bool().Draw(t, "by method") {
		r.CostByMethod = map[string]int64{"POST": rapid.Int64Range(1, 60).Draw(t, "post"), "get": 1}
	}
	c.Put = &r
	return c
}

// TestRuleStoreDeterministic: two replicas fed the same changes (through
// the codec, as Raft does) reach the same state bytes, whatever was
// refused on the way; the state restores into a third replica that
// encodes identically; and the machine's rules are always the store's
// global rules.
func TestRuleStoreDeterministic(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a, b := NewReplica(machineFor(t, "ap", "eu", "us")), NewReplica(machineFor(t, "ap", "eu", "us"))
		for range rapid.IntRange(1, 30).Draw(t, "changes") {
			c := genRuleChange(t)
			data, err := EncodeRuleChange(c)
			if err != nil {
				t.Fatal(err)
			}
			ra := a.Apply(data)
			rb := b.Apply(data)
			if fmt.Sprint(ra) != fmt.Sprint(rb) {
				t.Fatalf("diverged: %v, %v", ra, rb)
			}
			if errors.Is(ra.Err, ErrMalformedEntry) {
				t.Fatalf("a rule change decoded as malformed: %v", ra.Err)
			}
		}
		if !bytes.Equal(a.State(), b.State()) {
			t.Fatal("states diverged")
		}
		if a.rules.Version() > 0 {
			if got, want := fmt.Sprint(a.LeaseRules()), fmt.Sprint(a.rules.LeaseRules()); got != want {
				t.Fatalf("machine rules %s, store's global rules %s", got, want)
			}
		}
		c := NewReplica(machineFor(t, "ap", "eu", "us"))
		if err := c.Restore(a.State()); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(c.State(), a.State()) {
			t.Fatal("the restored state encodes differently")
		}
	})
}

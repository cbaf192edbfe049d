package lease

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/weir-dev/weir/quota"
)

// This file encodes the replicated state, a Machine's and the RuleStore's
// and DurableStore's beside it, for Raft snapshots. The encoding is
// versioned and deterministic: maps are written in sorted key order, so
// equal states encode to equal bytes on every replica.
//
//	"WLS" version(5)
//	now guard (varint) epoch (uvarint)
//	regions: count, each a string                     (must match Config)
//	rules: count, each id limit window burst maxCost  (sorted by id)
//	seqs: count, each reporter seq                    (sorted by reporter)
//	keys: count, each rule identity, then per region  (sorted by rule, identity)
//	      share epoch expiry hold release relTo relEp demand seen
//	rule store (version 2 only):
//	      version (uvarint)
//	      rules: count, each a rule's canonical JSON  (sorted by id)
//	      history: count, each version at principal requestID op id before
//	               after digest
//	               (oldest first; op 1 put, 2 delete; before and after are
//	               canonical JSON, empty for none)
//	durable store (versions 3 and 4; a state whose durable store is empty,
//	      its clock included, is written as version 2):
//	      now (varint)
//	      rules (version 4 only): count, each id interval burst since
//	               (sorted by id; exactly the rules of the buckets: the
//	               parameters of the rule's newest command and the store's
//	               time when they first appeared)
//	      buckets: count, each rule identity tat, and (version 4 only)
//	               interval burst, the parameters the bucket is in
//	               (sorted by rule, identity; only buckets not full:
//	               tat > now; interval and burst 0: unknown)
//	      requests: count, each id at allowed limit remaining reset
//	               retryAfter                         (oldest first, applied
//	               within DurableRetryWindow before now)
//	durable legacy buckets (version 5 only, once a command of key format 2
//	      was applied; before that the state is written as version 4 or
//	      lower): count, each rule identity tat interval burst
//	               (sorted by rule, identity; tat > now; interval and
//	               burst 0: unknown)
//
// Integers are varints (signed) or uvarints (counts, epochs, sequences,
// versions, ops); strings are a uvarint length and the bytes. Version 1
// (the machine alone) is still read, as a state with an empty rule store,
// version 2 (no durable store) as a state with an empty durable store, and
// version 3 (durable buckets without their parameters) as buckets whose
// parameters are unknown: each is taken to be in the parameters of its
// next decision, as a binary of that version did.
//
// Restoring checks the rule store as well as the form: its rules are a
// valid quota set in canonical, normalised form and id order; the history
// has at most MaxHistory entries with consecutive versions ending at the
// store's version, times that never go back, and a last digest equal to
// the set's; and once the store has a version, the machine's rules are the
// set's global rules (RuleStore.Apply keeps them so).

const (
	stateMagic   = "WLS"
	stateVersion = 5
)

// ErrBadState is wrapped by every error RestoreState returns for bytes it
// cannot read.
var ErrBadState = errors.New("lease: malformed state")

// MarshalState encodes the machine's replicated state (not its Config) in a
// versioned, deterministic form: two machines in the same state give the
// same bytes. The rule store section is empty and there is no durable store
// (so it is version 2): Replica.State encodes a machine with its stores.
func (m *Machine) MarshalState() []byte { return marshalState(m, nil) }

// marshalState encodes m and rs (nil: an empty store) with an empty durable
// store.
func marshalState(m *Machine, rs *RuleStore) []byte { return marshalFullState(m, rs, nil) }

// marshalFullState encodes m, rs and ds (nil: an empty store).
func marshalFullState(m *Machine, rs *RuleStore, ds *DurableStore) []byte {
	var w stateWriter
	if ds == nil {
		ds = NewDurableStore()
	}
	// The lowest version that holds the state: a state with an empty
	// durable store (never used, never ticked) is written as version 2,
	// which a binary from before durable rules reads too.
	version := byte(stateVersion)
	switch {
	case ds.empty():
		version = 2
	case !ds.switched:
		version = 4 // no legacy section (durable_legacy.go): read by binaries from before key formats
	}
	w.buf.WriteString(stateMagic)
	w.buf.WriteByte(version)
	w.int(m.now)
	w.int(m.guard)
	w.uint(m.epoch)
	w.uint(uint64(len(m.cfg.Regions)))
	for _, r := range m.cfg.Regions {
		w.str(r)
	}
	ids := slices.Sorted(maps.Keys(m.rules))
	w.uint(uint64(len(ids)))
	for _, id := range ids {
		r := m.rules[id]
		w.str(r.ID)
		w.int(r.Limit)
		w.int(int64(r.Window))
		w.int(r.Burst)
		w.int(r.MaxCost)
	}
	reporters := slices.Sorted(maps.Keys(m.seqs))
	w.uint(uint64(len(reporters)))
	for _, name := range reporters {
		w.str(name)
		w.uint(m.seqs[name])
	}
	writeKeys(&w, m.keys)
	if rs == nil {
		rs = NewRuleStore()
	}
	rs.marshal(&w)
	if version >= 3 {
		ds.marshal(&w)
	}
	if version >= 5 {
		ds.marshalLegacy(&w)
	}
	return w.buf.Bytes()
}

// writeKeys appends the keys section: the lease table, sorted.
func writeKeys(w *stateWriter, keys map[key]*keyState) {
	sorted := slices.SortedFunc(maps.Keys(keys), func(a, b key) int {
		return cmp.Or(cmp.Compare(a.rule, b.rule), cmp.Compare(a.identity, b.identity))
	})
	w.uint(uint64(len(sorted)))
	for _, k := range sorted {
		w.str(k.rule)
		w.str(k.identity)
		for _, l := range keys[k].regions {
			w.int(l.share)
			w.uint(l.epoch)
			w.int(l.expiry)
			w.int(l.hold)
			w.int(l.release)
			w.int(l.relTo)
			w.uint(l.relEp)
			w.int(l.demand)
			w.int(l.seen)
		}
	}
}

// marshal appends the rule store section.
func (rs *RuleStore) marshal(w *stateWriter) {
	w.uint(rs.version)
	w.uint(uint64(len(rs.raw)))
	for _, b := range rs.raw {
		w.bytes(b)
	}
	w.uint(uint64(len(rs.history)))
	for _, e := range rs.history {
		w.uint(e.Version)
		w.int(e.At)
		w.str(e.Principal)
		w.str(e.RequestID)
		w.uint(uint64(e.Op))
		w.str(e.RuleID)
		w.bytes(e.Before)
		w.bytes(e.After)
		w.str(e.Digest)
	}
}

// StateInfo is what an encoded state (Replica.State, Machine.MarshalState)
// holds, read without restoring it: for an operator's or a test's look at
// a replica.
type StateInfo struct {
	// Now and Guard are the machine's time and takeover guard (unix ns on
	// the leaders' clocks); Epoch is the newest epoch it issued.
	Now, Guard int64
	Epoch      uint64
	// Rules are the machine's rules by id; Seqs the newest report sequence
	// applied per reporter.
	Rules map[string]Rule
	Seqs  map[string]uint64
	// Keys is the number of (rule, identity) entries of the lease table;
	// Leases is the table's canonical encoding: two states hold the same
	// leases exactly when their Leases are equal, whatever their times.
	Keys   int
	Leases []byte
	// RuleVersion is the rule store's version; RuleStore its canonical
	// encoding (rules and audit history), equal for equal stores.
	RuleVersion uint64
	RuleStore   []byte
	// DurableBuckets is the number of durable buckets held (not full).
	DurableBuckets int
}

// ReadState decodes an encoded state into its StateInfo. It fails,
// wrapping ErrBadState, where Restore would; it never panics.
func ReadState(b []byte) (StateInfo, error) {
	s, err := decodeState(b)
	if err != nil {
		return StateInfo{}, err
	}
	var keys, store stateWriter
	writeKeys(&keys, s.keys)
	s.store.marshal(&store)
	return StateInfo{Now: s.now, Guard: s.guard, Epoch: s.epoch, Rules: s.rules, Seqs: s.seqs, Keys: len(s.keys),
		Leases: keys.buf.Bytes(), RuleVersion: s.store.version, RuleStore: store.buf.Bytes(), DurableBuckets: s.durable.Len()}, nil
}

// RestoreState replaces the machine's replicated state with one that
// MarshalState encoded. The machine's Config must name the same regions as
// the encoder's. A state whose rule store or durable store is not empty is
// refused (restore it with its stores, through Replica.Restore). On error
// (wrapping ErrBadState) the machine is unchanged.
func (m *Machine) RestoreState(b []byte) error { return restoreState(m, nil, nil, b) }

// restoreState replaces m's state, rs's and ds's with b's; rs (ds) nil
// means b's rule store (durable store) must be empty. On error (wrapping
// ErrBadState) none changes.
func restoreState(m *Machine, rs *RuleStore, ds *DurableStore, b []byte) error {
	s, err := decodeState(b)
	if err != nil {
		return err
	}
	if !slices.Equal(s.regions, m.cfg.Regions) {
		return fmt.Errorf("%w: regions %q, but this machine has %q", ErrBadState, s.regions, m.cfg.Regions)
	}
	for _, id := range slices.Sorted(maps.Keys(s.rules)) {
		if err := m.ValidateRule(s.rules[id]); err != nil {
			return fmt.Errorf("%w: %w", ErrBadState, err)
		}
	}
	if s.store.version > 0 {
		if rs == nil {
			return fmt.Errorf("%w: the state holds a rule store (version %d): restore it through Replica.Restore", ErrBadState, s.store.version)
		}
		want := map[string]Rule{}
		for _, r := range s.store.LeaseRules() {
			want[r.ID] = r
		}
		if !maps.Equal(want, s.rules) {
			return fmt.Errorf("%w: the machine's rules differ from the rule store's global rules", ErrBadState)
		}
	}
	if ds == nil && (s.durable.Len() > 0 || s.durable.Requests() > 0) {
		return fmt.Errorf("%w: the state holds durable buckets: restore it through Replica.Restore", ErrBadState)
	}
	m.now, m.guard, m.epoch, m.rules, m.seqs, m.keys = s.now, s.guard, s.epoch, s.rules, s.seqs, s.keys
	if rs != nil {
		*rs = *s.store
	}
	if ds != nil {
		*ds = *s.durable
	}
	return nil
}

// state is a decoded MarshalState.
type state struct {
	now, guard int64
	epoch      uint64
	regions    []string
	rules      map[string]Rule
	seqs       map[string]uint64
	keys       map[key]*keyState
	store      *RuleStore    // never nil
	durable    *DurableStore // never nil
}

// decodeState reads MarshalState's encoding; it never panics.
func decodeState(b []byte) (*state, error) {
	r := stateReader{b: b}
	if !bytes.HasPrefix(b, []byte(stateMagic)) || len(b) < len(stateMagic)+1 {
		return nil, fmt.Errorf("%w: not a lease state", ErrBadState)
	}
	v := b[len(stateMagic)]
	if v < 1 || v > stateVersion {
		return nil, fmt.Errorf("%w: version %d, want %d (or 1, 2, 3, 4)", ErrBadState, v, stateVersion)
	}
	r.b = b[len(stateMagic)+1:]
	s := &state{rules: map[string]Rule{}, seqs: map[string]uint64{}, keys: map[key]*keyState{}}
	s.now, s.guard, s.epoch = r.int(), r.int(), r.uint()
	nr := r.count()
	for range nr {
		s.regions = append(s.regions, r.str())
	}
	if r.err == nil && nr == 0 {
		r.fail("no regions")
	}
	for range r.count() {
		rule := Rule{ID: r.str(), Limit: r.int(), Window: time.Duration(r.int()), Burst: r.int(), MaxCost: r.int()}
		if _, dup := s.rules[rule.ID]; dup && r.err == nil {
			r.fail(fmt.Sprintf("rule %q twice", rule.ID))
		}
		s.rules[rule.ID] = rule
	}
	for range r.count() {
		name, seq := r.str(), r.uint()
		if _, dup := s.seqs[name]; dup && r.err == nil {
			r.fail(fmt.Sprintf("reporter %q twice", name))
		}
		s.seqs[name] = seq
	}
	for range r.count() {
		k := key{r.str(), r.str()}
		ks := &keyState{regions: make([]regionLease, 0, min(nr, 64))}
		for range nr {
			ks.regions = append(ks.regions, regionLease{share: r.int(), epoch: r.uint(), expiry: r.int(), hold: r.int(),
				release: r.int(), relTo: r.int(), relEp: r.uint(), demand: r.int(), seen: r.int()})
			if r.err != nil {
				break
			}
		}
		if _, dup := s.keys[k]; dup && r.err == nil {
			r.fail(fmt.Sprintf("key %s/%q twice", k.rule, k.identity))
		}
		s.keys[k] = ks
		if r.err != nil {
			break
		}
	}
	s.store = NewRuleStore()
	if v >= 2 && r.err == nil {
		s.store = r.ruleStore()
	}
	s.durable = NewDurableStore()
	if v >= 3 && r.err == nil {
		s.durable = r.durableStore(v)
	}
	if v >= 5 && r.err == nil {
		r.durableLegacy(s.durable)
	}
	if r.err == nil && len(r.b) != 0 {
		r.fail(fmt.Sprintf("%d bytes left over", len(r.b)))
	}
	if r.err != nil {
		return nil, r.err
	}
	return s, nil
}

type stateWriter struct {
	buf bytes.Buffer
	tmp [binary.MaxVarintLen64]byte
}

func (w *stateWriter) int(v int64)   { w.buf.Write(binary.AppendVarint(w.tmp[:0], v)) }
func (w *stateWriter) uint(v uint64) { w.buf.Write(binary.AppendUvarint(w.tmp[:0], v)) }
func (w *stateWriter) str(s string) {
	w.uint(uint64(len(s)))
	w.buf.WriteString(s)
}
func (w *stateWriter) bytes(b []byte) {
	w.uint(uint64(len(b)))
	w.buf.Write(b)
}

// stateReader reads varints and strings; after the first error every read
// returns zero and the error stays.
type stateReader struct {
	b   []byte
	err error
}

func (r *stateReader) fail(what string) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %s", ErrBadState, what)
	}
	r.b = nil
}

func (r *stateReader) int() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.fail("truncated or overlong integer")
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *stateReader) uint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail("truncated or overlong integer")
		return 0
	}
	r.b = r.b[n:]
	return v
}

// count reads a count, refusing one larger than the bytes left could hold
// (every element takes at least one byte), so a corrupt count cannot make
// the decoder allocate or loop without bound.
func (r *stateReader) count() int {
	v := r.uint()
	if v > uint64(len(r.b)) {
		r.fail(fmt.Sprintf("count %d exceeds the %d bytes left", v, len(r.b)))
		return 0
	}
	return int(v)
}

func (r *stateReader) str() string {
	n := r.count()
	if r.err != nil {
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

// ruleStore reads and checks the rule store section; on failure it records
// the error and returns an empty store.
func (r *stateReader) ruleStore() *RuleStore {
	empty := NewRuleStore()
	version := r.uint()
	n := r.count()
	raw := make([][]byte, 0, min(n, 1024))
	rules := make([]quota.Rule, 0, min(n, 1024))
	for range n {
		b := []byte(r.str())
		if r.err != nil {
			return empty
		}
		rule, err := DecodeRuleJSON(b)
		if err != nil {
			r.fail(fmt.Sprintf("rule %d: %v", len(rules), err))
			return empty
		}
		if len(rules) > 0 && rules[len(rules)-1].ID >= rule.ID {
			r.fail(fmt.Sprintf("rule %q out of id order", rule.ID))
			return empty
		}
		raw, rules = append(raw, b), append(rules, rule)
	}
	set, err := quota.NewSet(rules, version)
	if err != nil {
		r.fail(fmt.Sprintf("the rule set is invalid: %v", err))
		return empty
	}
	for i := range raw {
		canon, err := EncodeRuleJSON(*set.Rule(i))
		if err != nil || !bytes.Equal(canon, raw[i]) {
			r.fail(fmt.Sprintf("rule %q is not in canonical form", rules[i].ID))
			return empty
		}
	}
	nh := r.count()
	if nh > MaxHistory {
		r.fail(fmt.Sprintf("%d history entries, over %d", nh, MaxHistory))
		return empty
	}
	history := make([]AuditEntry, 0, min(nh, 1024))
	for range nh {
		e := AuditEntry{Version: r.uint(), At: r.int(), Principal: r.str(), RequestID: r.str()}
		op := r.uint()
		e.RuleID = r.str()
		before, after := r.str(), r.str()
		e.Digest = r.str()
		if r.err != nil {
			return empty
		}
		if before != "" {
			e.Before = []byte(before)
		}
		if after != "" {
			e.After = []byte(after)
		}
		if msg := checkAudit(e, op, history); msg != "" {
			r.fail(fmt.Sprintf("history entry %d: %s", len(history), msg))
			return empty
		}
		e.Op = RuleOp(op)
		history = append(history, e)
	}
	switch {
	case version == 0 && (len(rules) > 0 || len(history) > 0):
		r.fail("a rule store of version 0 with rules or history")
		return empty
	case version > 0 && len(history) == 0:
		r.fail(fmt.Sprintf("a rule store of version %d with no history", version))
		return empty
	case version > 0 && history[len(history)-1].Version != version:
		r.fail(fmt.Sprintf("the history ends at version %d, the store is at %d", history[len(history)-1].Version, version))
		return empty
	case version > 0 && history[len(history)-1].Digest != set.Digest():
		r.fail("the last audit entry's digest is not the rule set's")
		return empty
	}
	return &RuleStore{version: version, set: set, raw: raw, history: history}
}

// checkAudit checks one audit entry against the ones before it; it returns
// what is wrong, or "".
func checkAudit(e AuditEntry, op uint64, prev []AuditEntry) string {
	if n := len(prev); n > 0 {
		if p := prev[n-1]; e.Version != p.Version+1 || e.At < p.At {
			return fmt.Sprintf("version %d at %d after version %d at %d", e.Version, e.At, p.Version, p.At)
		}
	}
	if e.Version == 0 {
		return "version 0"
	}
	if err := (RuleChange{Principal: e.Principal, RequestID: e.RequestID, Delete: "x"}).Check(); err != nil {
		return err.Error()
	}
	if e.RuleID == "" {
		return "no rule id"
	}
	switch RuleOp(op) {
	case OpPut:
		if e.After == nil {
			return "a put with no rule after it"
		}
	case OpDelete:
		if e.Before == nil || e.After != nil {
			return "a delete must have a rule before it and none after"
		}
	default:
		return fmt.Sprintf("unknown op %d", op)
	}
	for _, b := range [][]byte{e.Before, e.After} {
		if b == nil {
			continue
		}
		rule, err := DecodeRuleJSON(b)
		if err != nil {
			return err.Error()
		}
		if rule.ID != e.RuleID {
			return fmt.Sprintf("a rule %q in an entry for %q", rule.ID, e.RuleID)
		}
	}
	return ""
}

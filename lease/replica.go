package lease

import (
	"fmt"
	"maps"
	"slices"

	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/quota"
)

// Replica is one replica of the lease group's replicated state: a Machine,
// the RuleStore and the DurableStore beside it. Apply is the whole of what
// a log entry does to it, deterministic like Machine.Apply, so the Raft
// FSM (lease/raftgroup) only decodes, locks and calls it, and every replica
// that applies the same entries holds the same state. A Replica is not safe
// for concurrent use; the zero value is not usable (NewReplica).
type Replica struct {
	m       *Machine
	rules   *RuleStore
	durable *DurableStore
}

// NewReplica returns the replica over m, an empty rule store and an empty
// durable store. The replica owns m from then on.
func NewReplica(m *Machine) *Replica {
	return &Replica{m: m, rules: NewRuleStore(), durable: NewDurableStore()}
}

// ApplyResponse is what applying a log entry gives: the command's Result,
// or the rule store's version after a rule change, or a durable decision,
// or the error that refused it (a malformed entry, or one Machine.Apply,
// RuleStore.Apply or DurableStore.Apply refused). A no-op entry gives the
// zero value.
type ApplyResponse struct {
	Result      Result
	RuleVersion uint64
	Durable     bucket.Decision
	Err         error
}

// Apply decodes the log entry b (DecodeLogEntry) and applies it
// (ApplyEntry); a malformed entry gives its error and changes nothing.
func (r *Replica) Apply(b []byte) ApplyResponse {
	e, err := DecodeLogEntry(b)
	if err != nil {
		return ApplyResponse{Err: err}
	}
	return r.ApplyEntry(e)
}

// ApplyEntry applies one decoded log entry: a lease command to the
// Machine, a rule change to the rule store (which passes the set's global
// rules on to the Machine in the same step), a durable decision to the
// durable store; the zero Entry is a no-op. Once the rule store has a
// version, it owns the machine's rules: a Command{Rules} from elsewhere is
// refused, so the two cannot disagree. A Tick also ticks the durable store
// (dropping its full buckets).
func (r *Replica) ApplyEntry(e Entry) ApplyResponse {
	switch {
	case e.Rule != nil:
		v, err := r.rules.Apply(r.m, *e.Rule)
		return ApplyResponse{RuleVersion: v, Err: err}
	case e.Durable != nil:
		d, err := r.durable.Apply(*e.Durable)
		return ApplyResponse{Durable: d, Err: err}
	case e.Command != nil:
		if e.Command.Rules != nil && r.rules.Version() > 0 {
			return ApplyResponse{Err: fmt.Errorf("%w: the rule store (version %d) manages the lease rules: change them with PutRule and DeleteRule",
				ErrBadCommand, r.rules.Version())}
		}
		res, err := r.m.Apply(*e.Command)
		if e.Command.Tick {
			r.durable.Tick(e.Command.Now)
		}
		return ApplyResponse{Result: res, Err: err}
	}
	return ApplyResponse{}
}

// State returns the encoded state of the three (snapshot.go), what a
// snapshot persists.
func (r *Replica) State() []byte { return marshalFullState(r.m, r.rules, r.durable) }

// Restore replaces the state with the encoded state b (State's format, or
// an older version of it). On error, wrapping ErrBadState, the state is
// unchanged.
func (r *Replica) Restore(b []byte) error { return restoreState(r.m, r.rules, r.durable, b) }

// Now is the machine's time (unix ns): the latest time of the commands it
// applied. A command stamped earlier than that (proposals that reached the
// log in another order than their leader's clock read them) is applied at
// this time, and the leases it grants are counted from it.
func (r *Replica) Now() int64 { return r.m.Now() }

// DurableTAT reads a durable bucket: its TAT (unix ns on the leaders'
// clocks), ok false for a full bucket.
func (r *Replica) DurableTAT(rule, identity string) (tat int64, ok bool) {
	return r.durable.TAT(rule, identity)
}

// DurableLen is the number of durable buckets held (those not full) and of
// request ids remembered.
func (r *Replica) DurableLen() (buckets, requests int) {
	return r.durable.Len(), r.durable.Requests()
}

// RuleView is one consistent read of the rule store.
type RuleView struct {
	// Version is the store's version; Digest quota's digest of the set.
	Version uint64
	Digest  string
	// Rules are the rules, normalised and ordered by id (nil unless
	// asked for).
	Rules []quota.Rule
	// History holds the audit entries asked for, oldest first; Oldest is
	// the version of the oldest entry the store still keeps (0: none).
	History []AuditEntry
	Oldest  uint64
}

// ReadRules reads the rule store: its rules when withRules, and up to limit
// audit entries newer than since when withHistory (limit ≤ 0: all kept).
func (r *Replica) ReadRules(withRules, withHistory bool, since uint64, limit int) RuleView {
	v := RuleView{Version: r.rules.Version(), Digest: r.rules.Digest(), Oldest: r.rules.Oldest()}
	if withRules {
		v.Rules = r.rules.Rules()
	}
	if withHistory {
		v.History = r.rules.History(since, limit)
	}
	return v
}

// LeaseRules returns the rules the Machine holds, ordered by id.
func (r *Replica) LeaseRules() []Rule {
	ids := slices.Sorted(maps.Keys(r.m.rules))
	out := make([]Rule, len(ids))
	for i, id := range ids {
		out[i] = r.m.rules[id]
	}
	return out
}

// Check runs Machine.Check.
func (r *Replica) Check() error { return r.m.Check() }

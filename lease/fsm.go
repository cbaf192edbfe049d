package lease

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"

	"github.com/hashicorp/raft"

	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/quota"
)

// FSM is the raft.FSM over a Machine and the RuleStore and DurableStore
// beside it: Apply decodes a log entry and hands it to the Machine (a lease
// command; a Tick also ticks the durable store), the rule store (a rule
// change, which passes the set's global rules on to the Machine in the same
// step) or the durable store (a durable decision), nothing else; Snapshot
// and Restore encode and restore the three together (snapshot.go). Its methods are safe for concurrent
// use (raft calls Apply, Snapshot and Restore from one goroutine; readers
// such as Check and ReadRules may run beside it).
type FSM struct {
	mu       sync.Mutex
	m        *Machine
	rules    *RuleStore
	durable  *DurableStore
	restores int // how many snapshots Restore installed
}

var (
	_ raft.FSM         = (*FSM)(nil)
	_ raft.FSMSnapshot = fsmSnapshot(nil)
)

// NewFSM returns the FSM over m, an empty rule store and an empty durable
// store. The FSM owns m from then on: read it only through the FSM's
// methods.
func NewFSM(m *Machine) *FSM { return &FSM{m: m, rules: NewRuleStore(), durable: NewDurableStore()} }

// ApplyResponse is what FSM.Apply returns (raft's ApplyFuture.Response):
// the command's Result, or the rule store's version after a rule change, or
// a durable decision, or the error that refused it (a malformed entry, or
// one Machine.Apply, RuleStore.Apply or DurableStore.Apply refused). A no-op
// entry gives the zero value.
type ApplyResponse struct {
	Result      Result
	RuleVersion uint64
	Durable     bucket.Decision
	Err         error
}

// Apply implements raft.FSM. Entries that are not commands (raft's own
// configuration and no-op entries) never reach it.
func (f *FSM) Apply(l *raft.Log) any {
	e, err := DecodeLogEntry(l.Data)
	if err != nil {
		return ApplyResponse{Err: err}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return applyEntry(f.m, f.rules, f.durable, e)
}

// Snapshot implements raft.FSM: it encodes the state at once, so Persist
// may run beside later Applies.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	return fsmSnapshot(f.State()), nil
}

// Restore implements raft.FSM: it replaces the machine's state with the
// snapshot's. On error the state is unchanged.
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return fmt.Errorf("lease: reading a snapshot: %w", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := restoreState(f.m, f.rules, f.durable, b); err != nil {
		return err
	}
	f.restores++
	return nil
}

// State returns the encoded replicated state: the machine's, the rule
// store's and the durable store's (snapshot.go), what Snapshot persists.
func (f *FSM) State() []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return marshalFullState(f.m, f.rules, f.durable)
}

// DurableTAT reads a durable bucket from this replica: its TAT (unix ns on
// the leaders' clocks), ok false for a full bucket.
func (f *FSM) DurableTAT(rule, identity string) (tat int64, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.durable.TAT(rule, identity)
}

// DurableLen is the number of durable buckets this replica holds (those
// not full) and of request ids it remembers.
func (f *FSM) DurableLen() (buckets, requests int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.durable.Len(), f.durable.Requests()
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
func (f *FSM) ReadRules(withRules, withHistory bool, since uint64, limit int) RuleView {
	f.mu.Lock()
	defer f.mu.Unlock()
	v := RuleView{Version: f.rules.Version(), Digest: f.rules.Digest(), Oldest: f.rules.Oldest()}
	if withRules {
		v.Rules = f.rules.Rules()
	}
	if withHistory {
		v.History = f.rules.History(since, limit)
	}
	return v
}

// LeaseRules returns the rules the lease Machine holds, ordered by id.
func (f *FSM) LeaseRules() []Rule {
	f.mu.Lock()
	defer f.mu.Unlock()
	ids := slices.Sorted(maps.Keys(f.m.rules))
	out := make([]Rule, len(ids))
	for i, id := range ids {
		out[i] = f.m.rules[id]
	}
	return out
}

// Check runs Machine.Check.
func (f *FSM) Check() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.m.Check()
}

// Restores returns how many snapshots Restore has installed.
func (f *FSM) Restores() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.restores
}

// fsmSnapshot is an encoded state.
type fsmSnapshot []byte

// Persist implements raft.FSMSnapshot.
func (s fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := sink.Write(s); err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("lease: writing a snapshot: %w", err)
	}
	return sink.Close()
}

// Release implements raft.FSMSnapshot.
func (fsmSnapshot) Release() {}

package raftgroup

import (
	"fmt"
	"io"
	"sync"

	"github.com/hashicorp/raft"

	"github.com/weir-dev/weir/lease"
)

// FSM is the raft.FSM over a lease.Replica (the Machine and the rule and
// durable stores beside it): Apply decodes a log entry and hands it to
// Replica.ApplyEntry, nothing else; Snapshot and Restore encode and restore
// the replica's state (lease's snapshot encoding). Its methods are safe for
// concurrent use (raft calls Apply, Snapshot and Restore from one
// goroutine; readers such as Check and ReadRules may run beside it).
type FSM struct {
	mu       sync.Mutex
	r        *lease.Replica
	restores int // how many snapshots Restore installed
	// applied, when set, sees every entry applied, its response and the
	// machine's time after it (lease.Replica.Now), under mu (the group
	// logs the grants of reports with it).
	applied func(e lease.Entry, resp lease.ApplyResponse, now int64)
}

var (
	_ raft.FSM         = (*FSM)(nil)
	_ raft.FSMSnapshot = fsmSnapshot(nil)
)

// NewFSM returns the FSM over m, an empty rule store and an empty durable
// store (lease.NewReplica). The FSM owns m from then on: read it only
// through the FSM's methods.
func NewFSM(m *lease.Machine) *FSM { return &FSM{r: lease.NewReplica(m)} }

// Apply implements raft.FSM: it returns the lease.ApplyResponse of the
// entry. Entries that are not commands (raft's own configuration and no-op
// entries) never reach it.
func (f *FSM) Apply(l *raft.Log) any {
	e, err := lease.DecodeLogEntry(l.Data)
	if err != nil {
		return lease.ApplyResponse{Err: err}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	resp := f.r.ApplyEntry(e)
	if f.applied != nil {
		f.applied(e, resp, f.r.Now())
	}
	return resp
}

// Snapshot implements raft.FSM: it encodes the state at once, so Persist
// may run beside later Applies.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	return fsmSnapshot(f.State()), nil
}

// Restore implements raft.FSM: it replaces the replica's state with the
// snapshot's. On error the state is unchanged.
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return fmt.Errorf("lease: reading a snapshot: %w", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.r.Restore(b); err != nil {
		return err
	}
	f.restores++
	return nil
}

// State returns the encoded replicated state (lease.Replica.State), what
// Snapshot persists.
func (f *FSM) State() []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.r.State()
}

// DurableTAT reads a durable bucket from this replica: its TAT (unix ns on
// the leaders' clocks), ok false for a full bucket.
func (f *FSM) DurableTAT(rule, identity string) (tat int64, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.r.DurableTAT(rule, identity)
}

// DurableLen is the number of durable buckets this replica holds (those
// not full) and of request ids it remembers.
func (f *FSM) DurableLen() (buckets, requests int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.r.DurableLen()
}

// ReadRules reads the rule store (lease.Replica.ReadRules): its rules when
// withRules, and up to limit audit entries newer than since when
// withHistory (limit ≤ 0: all kept).
func (f *FSM) ReadRules(withRules, withHistory bool, since uint64, limit int) lease.RuleView {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.r.ReadRules(withRules, withHistory, since, limit)
}

// LeaseRules returns the rules the lease Machine holds, ordered by id.
func (f *FSM) LeaseRules() []lease.Rule {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.r.LeaseRules()
}

// Check runs Machine.Check.
func (f *FSM) Check() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.r.Check()
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

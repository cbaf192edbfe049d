package lease

import (
	"fmt"
	"io"
	"sync"

	"github.com/hashicorp/raft"
)

// FSM is the raft.FSM over a Machine: Apply decodes a log entry and calls
// Machine.Apply, nothing else; Snapshot and Restore go through
// MarshalState and RestoreState. Its methods are safe for concurrent use
// (raft calls Apply, Snapshot and Restore from one goroutine; readers such
// as Check may run beside it).
type FSM struct {
	mu       sync.Mutex
	m        *Machine
	restores int // how many snapshots Restore installed
}

var (
	_ raft.FSM         = (*FSM)(nil)
	_ raft.FSMSnapshot = fsmSnapshot(nil)
)

// NewFSM returns the FSM over m. The FSM owns m from then on: read it only
// through the FSM's methods.
func NewFSM(m *Machine) *FSM { return &FSM{m: m} }

// ApplyResponse is what FSM.Apply returns (raft's ApplyFuture.Response):
// the command's Result, or the error that refused it (a malformed entry,
// or one Machine.Apply refused). A no-op entry gives the zero value.
type ApplyResponse struct {
	Result Result
	Err    error
}

// Apply implements raft.FSM. Entries that are not commands (raft's own
// configuration and no-op entries) never reach it.
func (f *FSM) Apply(l *raft.Log) any {
	c, ok, err := DecodeEntry(l.Data)
	if err != nil || !ok {
		return ApplyResponse{Err: err}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	res, err := f.m.Apply(c)
	return ApplyResponse{Result: res, Err: err}
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
	if err := f.m.RestoreState(b); err != nil {
		return err
	}
	f.restores++
	return nil
}

// State returns the machine's MarshalState.
func (f *FSM) State() []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.m.MarshalState()
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

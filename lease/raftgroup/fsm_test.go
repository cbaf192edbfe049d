package raftgroup

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/weir-dev/weir/lease"
)

// testMachine is a machine of testMachineConfig with testRule.
func testMachine(t testing.TB) *lease.Machine {
	t.Helper()
	m, err := lease.NewMachine(testMachineConfig)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Apply(lease.Command{Now: 1, Rules: []lease.Rule{testRule}}); err != nil {
		t.Fatal(err)
	}
	return m
}

// memSink is a raft.SnapshotSink in memory.
type memSink struct{ bytes.Buffer }

func (*memSink) ID() string    { return "mem" }
func (*memSink) Cancel() error { return nil }
func (*memSink) Close() error  { return nil }

// TestFSMSnapshotRestore: the FSM's snapshot, restored into another FSM,
// gives the same state; a bad snapshot is refused and changes nothing.
func TestFSMSnapshotRestore(t *testing.T) {
	a := NewFSM(testMachine(t))
	for i, r := range []string{"ap", "eu", "us"} {
		b, err := lease.EncodeEntry(lease.Command{Now: int64(i + 2), Report: &lease.Report{Reporter: r, Seq: 1, Region: r,
			Items: []lease.ReportItem{{Rule: "global", Identity: "c", Demand: int64(100 * (i + 1))}}}})
		if err != nil {
			t.Fatal(err)
		}
		if resp := a.Apply(&raft.Log{Data: b}).(lease.ApplyResponse); resp.Err != nil || len(resp.Result.Grants) != 1 {
			t.Fatalf("apply: %+v", resp)
		}
	}
	snap, err := a.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var sink memSink
	if err := snap.Persist(&sink); err != nil {
		t.Fatal(err)
	}
	snap.Release()
	b := NewFSM(testMachine(t))
	before := b.State()
	if err := b.Restore(io.NopCloser(bytes.NewReader([]byte("garbage")))); !errors.Is(err, lease.ErrBadState) {
		t.Fatalf("garbage snapshot: %v", err)
	}
	if !bytes.Equal(b.State(), before) || b.Restores() != 0 {
		t.Fatal("a refused snapshot changed the FSM")
	}
	if err := b.Restore(io.NopCloser(&sink)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.State(), b.State()) || b.Restores() != 1 {
		t.Fatal("restored state differs")
	}
	if resp := b.Apply(&raft.Log{Data: noopEntry}).(lease.ApplyResponse); resp.Err != nil || len(resp.Result.Grants) != 0 {
		t.Fatalf("no-op entry: %+v", resp)
	}
}

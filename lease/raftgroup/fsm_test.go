package raftgroup

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

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

// TestFSMLogsGrantsAtMachineTime: "lease granted" names the report's
// reporter and sequence number and is counted from the machine's time when
// it applied the report. A report stamped before one applied ahead of it
// (two proposals that reached the log out of their clock order) is
// applied, and logged, at the later time with the expiry the machine
// holds; a retry of an applied report is logged with the leases it got
// back, their expiry unchanged.
func TestFSMLogsGrantsAtMachineTime(t *testing.T) {
	var buf bytes.Buffer
	g := &Group{log: slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	f := NewFSM(testMachine(t))
	f.applied = g.logGrants
	life := int64(testMachineConfig.LeaseDuration)
	apply := func(now int64, reporter string, seq uint64) lease.Grant {
		t.Helper()
		region := reporter[:2]
		b, err := lease.EncodeEntry(lease.Command{Now: now, Report: &lease.Report{Reporter: reporter, Seq: seq, Region: region,
			Items: []lease.ReportItem{{Rule: "global", Identity: "c", Demand: 100}}}})
		if err != nil {
			t.Fatal(err)
		}
		resp := f.Apply(&raft.Log{Data: b}).(lease.ApplyResponse)
		if resp.Err != nil || len(resp.Result.Grants) != 1 || resp.Result.Grants[0].Epoch == 0 {
			t.Fatalf("report of %s seq %d at %d: %+v", reporter, seq, now, resp)
		}
		return resp.Result.Grants[0]
	}
	type line struct {
		Msg, Region, Reporter       string
		Seq, Epoch                  uint64
		At, Proposed, Expiry, Share int64
	}
	last := func() line {
		t.Helper()
		lines := bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n"))
		var l line
		if err := json.Unmarshal(lines[len(lines)-1], &l); err != nil || l.Msg != "lease granted" {
			t.Fatalf("last line %q: %v", lines[len(lines)-1], err)
		}
		return l
	}

	const t0 = int64(1_000_000_000_000)
	apply(t0, "eu-1", 7)
	if l := last(); l.Reporter != "eu-1" || l.Seq != 7 || l.Region != "eu" || l.At != t0 || l.Proposed != t0 || l.Expiry != t0+life {
		t.Fatalf("first grant logged as %+v", l)
	}
	apply(t0+int64(3*time.Second), "us-1", 3)
	// eu-1's next report, stamped before us-1's, applied after it.
	gr := apply(t0+int64(2*time.Second), "eu-1", 8)
	applied := t0 + int64(3*time.Second)
	l := last()
	if l.Reporter != "eu-1" || l.Seq != 8 || l.At != applied || l.Proposed != t0+int64(2*time.Second) || l.Expiry != applied+gr.Lifetime || l.Expiry != applied+life {
		t.Fatalf("grant of a report stamped before the machine's time logged as %+v (lifetime %d)", l, gr.Lifetime)
	}
	// A retry of seq 8, applied again a second later: the lease is not
	// renewed, its expiry is what the first application set.
	apply(applied+int64(time.Second), "eu-1", 8)
	if r := last(); r.Seq != 8 || r.At != applied+int64(time.Second) || r.Expiry != l.Expiry || r.Epoch != l.Epoch {
		t.Fatalf("retry logged as %+v, first application %+v", r, l)
	}
}

package lease

import (
	"bytes"
	"errors"
	"testing"
)

// TestReplicaApply: Replica.Apply decodes and applies an entry of each kind
// and refuses a malformed one without a change; the zero Entry encodes as
// the no-op entry, which applies as nothing.
func TestReplicaApply(t *testing.T) {
	r := NewReplica(newTestMachine(t, "ap", "eu", "us"))
	noop, err := EncodeLogEntry(Entry{})
	if err != nil {
		t.Fatal(err)
	}
	if e, err := DecodeLogEntry(noop); err != nil || e != (Entry{}) {
		t.Fatalf("the zero Entry decodes to %+v, %v", e, err)
	}
	before := r.State()
	if resp := r.Apply(noop); resp.Err != nil || len(resp.Result.Grants) != 0 || resp.RuleVersion != 0 || !bytes.Equal(r.State(), before) {
		t.Fatalf("no-op: %+v", resp)
	}
	if resp := r.Apply([]byte{9, 9}); !errors.Is(resp.Err, ErrMalformedEntry) || !bytes.Equal(r.State(), before) {
		t.Fatalf("malformed entry: %+v", resp)
	}
	rep, err := EncodeLogEntry(Entry{Command: &Command{Now: 5, Report: &Report{Reporter: "eu-1", Seq: 1, Region: "eu",
		Items: []ReportItem{{Rule: "global", Identity: "c", Demand: 100}}}}})
	if err != nil {
		t.Fatal(err)
	}
	if resp := r.Apply(rep); resp.Err != nil || len(resp.Result.Grants) != 1 {
		t.Fatalf("report: %+v", resp)
	}
	put, err := EncodeLogEntry(Entry{Rule: &RuleChange{Now: 6, Principal: "alice", Put: &searchRule}})
	if err != nil {
		t.Fatal(err)
	}
	if resp := r.Apply(put); resp.Err != nil || resp.RuleVersion != 1 {
		t.Fatalf("rule put: %+v", resp)
	}
	durable, err := EncodeLogEntry(Entry{Durable: &DurableCommand{Now: 7, Rule: trialRule, Identity: "a", Cost: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if resp := r.Apply(durable); resp.Err != nil || !resp.Durable.Allowed {
		t.Fatalf("durable: %+v", resp)
	}
	if n, _ := r.DurableLen(); n != 1 {
		t.Fatalf("%d durable buckets, want 1", n)
	}
	if v := r.ReadRules(true, true, 0, 0); v.Version != 1 || len(v.Rules) != 1 || len(v.History) != 1 {
		t.Fatalf("rule view %+v", v)
	}
	if err := r.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestReadState: ReadState reads what a state holds; two replicas that
// applied the same reports at different times hold equal Leases only when
// the lease tables are equal.
func TestReadState(t *testing.T) {
	a := NewReplica(newTestMachine(t, "ap", "eu", "us"))
	report := func(r *Replica, now int64, demand int64) {
		t.Helper()
		if resp := r.ApplyEntry(Entry{Command: &Command{Now: now, Report: &Report{Reporter: "eu-1", Seq: uint64(now), Region: "eu",
			Items: []ReportItem{{Rule: "global", Identity: "c", Demand: demand}}}}}); resp.Err != nil {
			t.Fatal(resp.Err)
		}
	}
	report(a, 5, 100)
	s, err := ReadState(a.State())
	if err != nil {
		t.Fatal(err)
	}
	if s.Now != 5 || s.Keys != 1 || s.Seqs["eu-1"] != 5 || len(s.Rules) != 1 || s.RuleVersion != 0 || s.DurableBuckets != 0 {
		t.Fatalf("state info %+v", s)
	}
	b := NewReplica(newTestMachine(t, "ap", "eu", "us"))
	report(b, 5, 100)
	if b.ApplyEntry(Entry{Command: &Command{Now: 6, Tick: true}}).Err != nil {
		t.Fatal("tick refused")
	}
	sb, _ := ReadState(b.State())
	if sb.Now != 6 || !bytes.Equal(sb.Leases, s.Leases) {
		t.Fatalf("a tick that changes no lease: now %d, leases equal %v", sb.Now, bytes.Equal(sb.Leases, s.Leases))
	}
	report(b, 7, 900)
	if sc, _ := ReadState(b.State()); bytes.Equal(sc.Leases, s.Leases) {
		t.Fatal("a grown lease left the table's encoding unchanged")
	}
	if _, err := ReadState([]byte("garbage")); !errors.Is(err, ErrBadState) {
		t.Fatalf("garbage: %v", err)
	}
}

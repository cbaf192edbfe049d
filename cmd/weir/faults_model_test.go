package main

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/anishathalye/porcupine"
)

// This file is the sequential model the process fault harness checks the
// history of durable decisions against (faults_test.go), with porcupine.
//
// A durable rule is a GCRA bucket kept in the lease group (docs/durable.md):
// a request of cost c for an identity that has spent n tokens is admitted
// when n + c ≤ burst + refill, and a rejection spends nothing. The harness's
// rule refills one token per durableInterval, far longer than any run, so
// within a run refill never adds a token and the model needs no decision
// time: an identity admits exactly while its spend stays within the burst.
// (A rule that refills inside the run would need the group's decision time,
// which a durable decision does not return to the caller.)
//
// A call that failed (timed out, or the group had no leader) may or may not
// have been applied: it is an operation whose response never arrived (its
// return time is after every other operation's), and the model lets it be
// applied either way.

// durableOp is one durable decision as the client saw it.
type durableOp struct {
	ID   uint32 // the identity's number
	Cost int64
}

// Outcomes of a durable decision.
const (
	outRejected uint8 = iota
	outAdmitted
	outUnknown // the call failed: applied or not, we cannot tell
)

// durableModel is the model of one durable rule of the given burst (and no
// refill within the history), partitioned by identity.
func durableModel(burst int64) porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
			by := map[uint32][]porcupine.Operation{}
			var ids []uint32
			for _, op := range h {
				id := op.Input.(durableOp).ID
				if _, ok := by[id]; !ok {
					ids = append(ids, id)
				}
				by[id] = append(by[id], op)
			}
			slices.Sort(ids)
			out := make([][]porcupine.Operation, 0, len(ids))
			for _, id := range ids {
				out = append(out, by[id])
			}
			return out
		},
		Init: func() []any { return []any{int64(0)} },
		Step: func(state, input, output any) []any {
			spent, in := state.(int64), input.(durableOp)
			fits := spent+in.Cost <= burst
			switch output.(uint8) {
			case outAdmitted:
				if fits {
					return []any{spent + in.Cost}
				}
				return nil
			case outRejected:
				if !fits {
					return []any{spent}
				}
				return nil
			default: // unknown: not applied, or applied (admitted when it fits, else rejected)
				if fits {
					return []any{spent, spent + in.Cost}
				}
				return []any{spent}
			}
		},
		DescribeOperation: func(input, output any) string {
			in := input.(durableOp)
			return fmt.Sprintf("id %d cost %d -> %s", in.ID, in.Cost, []string{"rejected", "admitted", "unknown"}[output.(uint8)])
		},
	}
	return nm.ToModel()
}

// durableRec is one recorded durable decision: call and return times (ns
// since the run's start, the client's clock), identity, cost and outcome.
type durableRec struct {
	Call, Return int64
	ID           uint32
	Cost         uint8
	Out          uint8
}

// durableHistory turns records into porcupine operations: an unknown
// outcome never returned.
func durableHistory(recs []durableRec) []porcupine.Operation {
	ops := make([]porcupine.Operation, 0, len(recs))
	for i, r := range recs {
		ret := r.Return
		if r.Out == outUnknown {
			ret = math.MaxInt64
		}
		ops = append(ops, porcupine.Operation{ClientId: i, Input: durableOp{ID: r.ID, Cost: int64(r.Cost)}, Call: r.Call,
			Output: r.Out, Return: ret})
	}
	return ops
}

// overAdmitted returns the identities whose admitted cost exceeds burst.
func overAdmitted(recs []durableRec, burst int64) map[uint32]int64 {
	spent := map[uint32]int64{}
	for _, r := range recs {
		if r.Out == outAdmitted {
			spent[r.ID] += int64(r.Cost)
		}
	}
	over := map[uint32]int64{}
	for id, s := range spent {
		if s > burst {
			over[id] = s
		}
	}
	return over
}

// TestDurableModel shows the durable checker can fail: a concurrent history
// that is linearizable passes, the same history with one admission past
// the burst injected by hand (a rejection turned into an admission) does
// not, and neither does one admission too many hidden among calls whose
// outcome is unknown.
func TestDurableModel(t *testing.T) {
	const burst = 5
	m := durableModel(burst)
	// Identity 1: three clients overlapping; 2+2+1 admitted, then two
	// rejections. Identity 2: sequential, with a failed call in the middle.
	good := []durableRec{
		{Call: 0, Return: 10, ID: 1, Cost: 2, Out: outAdmitted},
		{Call: 1, Return: 12, ID: 1, Cost: 2, Out: outAdmitted},
		{Call: 5, Return: 15, ID: 1, Cost: 2, Out: outRejected}, // after 2+2+1: linearized last
		{Call: 6, Return: 14, ID: 1, Cost: 1, Out: outAdmitted},
		{Call: 20, Return: 30, ID: 1, Cost: 1, Out: outRejected},
		{Call: 0, Return: 5, ID: 2, Cost: 1, Out: outAdmitted},
		{Call: 6, Return: 9, ID: 2, Cost: 2, Out: outUnknown},
		{Call: 10, Return: 12, ID: 2, Cost: 2, Out: outAdmitted},
		{Call: 13, Return: 15, ID: 2, Cost: 2, Out: outAdmitted}, // fits only if the unknown one was not applied
		{Call: 16, Return: 18, ID: 2, Cost: 1, Out: outRejected},
	}
	if res := porcupine.CheckOperationsTimeout(m, durableHistory(good), 0); res != porcupine.Ok {
		t.Fatalf("a linearizable history checked %v", res)
	}
	if over := overAdmitted(good, burst); len(over) != 0 {
		t.Fatalf("over the limit in a good history: %v", over)
	}

	// One admission past the limit: the final rejection of identity 1
	// answered as an admission.
	bad := slices.Clone(good)
	bad[4].Out = outAdmitted
	if res := porcupine.CheckOperationsTimeout(m, durableHistory(bad), 0); res != porcupine.Illegal {
		t.Fatalf("a history with one admission past the limit checked %v, want Illegal", res)
	}
	if over := overAdmitted(bad, burst); over[1] != burst+1 {
		t.Fatalf("overAdmitted = %v, want identity 1 at %d", over, burst+1)
	}

	// A rejection no linearization explains: identity 2's first decision
	// rejected while the bucket was full.
	bad = slices.Clone(good)
	bad[5].Out = outRejected
	if res := porcupine.CheckOperationsTimeout(m, durableHistory(bad), 0); res != porcupine.Illegal {
		t.Fatalf("a history with a rejection of a full bucket checked %v, want Illegal", res)
	}

	// An order that breaks real time: two sequential admissions of 3 on a
	// burst of 5 are impossible whatever the unknown calls did.
	seq := []durableRec{
		{Call: 0, Return: 1, ID: 3, Cost: 3, Out: outAdmitted},
		{Call: 0, Return: 100, ID: 3, Cost: 1, Out: outUnknown},
		{Call: 2, Return: 3, ID: 3, Cost: 3, Out: outAdmitted},
	}
	if res := porcupine.CheckOperationsTimeout(m, durableHistory(seq), 0); res != porcupine.Illegal {
		t.Fatalf("3+3 admitted on a burst of 5 checked %v, want Illegal", res)
	}
}

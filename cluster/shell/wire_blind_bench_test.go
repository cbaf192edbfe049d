package shell

import (
	"fmt"
	"testing"

	"github.com/weir-dev/weir/cluster"
	"github.com/weir-dev/weir/cluster/peerpb"
)

// BenchmarkDecodeBlinds decodes a message's blind reports (16 reports of
// 64 items of one rule, identities of 10-12 bytes) as decodeBlinds does,
// each report's identities substrings of one string, beside the plain way,
// a string per item.
func BenchmarkDecodeBlinds(b *testing.B) {
	var items []cluster.BlindItem
	for r := range 16 {
		for i := range 64 {
			items = append(items, cluster.BlindItem{Stream: 1, Seq: uint64(r + 1), Rule: "api", Identity: fmt.Sprintf("id-%d-%d", r, i), Cost: 1})
		}
	}
	reports := encodeBlinds(items)
	b.Run("string-per-report", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := decodeBlinds(reports, len(items)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("string-per-item", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := decodeBlindsPerItem(reports, len(items)); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// decodeBlindsPerItem is decodeBlinds with a string of its own for each
// item's identity: the plain way, for BenchmarkDecodeBlinds.
func decodeBlindsPerItem(in []*peerpb.BlindReport, n int) ([]cluster.BlindItem, error) {
	out := make([]cluster.BlindItem, 0, n)
	for i, r := range in {
		if err := blindColumns(i, r); err != nil {
			return nil, err
		}
		ids := r.Identities
		for j, l := range r.IdentityLengths {
			out = append(out, cluster.BlindItem{Stream: r.Stream, Seq: r.Seq, Rule: r.Rules[r.RuleIndex[j]], Identity: string(ids[:l]), Cost: r.Costs[j]})
			ids = ids[l:]
		}
	}
	return out, nil
}

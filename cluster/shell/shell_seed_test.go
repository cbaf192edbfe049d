package shell

import (
	"fmt"
	"testing"

	"github.com/weir-dev/weir/cluster"

	"github.com/weir-dev/weir/bucket"
)

// TestShellShardSeeded: the shard an identity is decided in follows
// Config.Hasher, so a node's per-process seed reshuffles the shards
// (a client cannot choose identities that all queue on one mutex), while
// the zero Hasher stays deterministic.
func TestShellShardSeeded(t *testing.T) {
	shell := func(h bucket.Hasher) *Node {
		s, err := New(Config{Coordinator: cluster.CoordinatorConfig{Self: "a"}, Transport: NewInmemNetwork().Transport("a", nil),
			Shards: 16, Hasher: h})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	shards := func(s *Node) []int {
		out := make([]int, 256)
		for i := range out {
			out[i] = s.shardOf(fmt.Sprintf("user-%d", i))
		}
		return out
	}
	differ := func(a, b []int) int {
		n := 0
		for i := range a {
			if a[i] != b[i] {
				n++
			}
		}
		return n
	}
	z1, z2 := shards(shell(bucket.Hasher{})), shards(shell(bucket.Hasher{}))
	if d := differ(z1, z2); d != 0 {
		t.Fatalf("the zero Hasher placed %d of 256 identities differently", d)
	}
	r1, r2 := shards(shell(bucket.NewHasher())), shards(shell(bucket.NewHasher()))
	// Two random seeds agree on about 1/16 of the identities.
	if d := differ(r1, r2); d < 128 {
		t.Fatalf("two per-process seeds placed only %d of 256 identities differently", d)
	}
	if d := differ(r1, z1); d < 128 {
		t.Fatalf("a per-process seed placed only %d of 256 identities differently from the zero Hasher", d)
	}
}

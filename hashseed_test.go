package weir

import (
	"fmt"
	"testing"
)

// TestHashSeed: with Config.HashSeed zero every node draws its own seed, so
// the identity hash (store keys, recent counts), the hitters sketches'
// seeds and the cluster Shell's shard choice, all derived from it, cannot
// be predicted by a client choosing identities; a non-zero HashSeed makes
// them equal across nodes (the simulator, reproducible tests).
func TestHashSeed(t *testing.T) {
	mk := func(seed uint64) *Node {
		n, err := New(Config{HashSeed: seed})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		return n
	}
	same := func(a, b *Node) bool {
		for i := range 64 {
			id := fmt.Sprintf("id-%d", i)
			if a.hasher.Sum(id) != b.hasher.Sum(id) {
				return false
			}
		}
		return a.hasher.Sum("\x00seed: throttled") == b.hasher.Sum("\x00seed: throttled")
	}
	if same(mk(0), mk(0)) {
		t.Error("two nodes with HashSeed 0 hash identities alike: the seed is not drawn per node")
	}
	if !same(mk(42), mk(42)) {
		t.Error("two nodes with HashSeed 42 hash identities differently")
	}
	if same(mk(42), mk(43)) {
		t.Error("HashSeed 42 and 43 hash alike")
	}
}

package cluster

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/weir-dev/weir/bucket"
)

// vnodeRing is the alternative scheme Ring was measured against: a
// consistent-hash ring with virtual nodes (groupcache's consistenthash with
// sorted uint64 points and deterministic collision handling). It lives in a
// test file only, for TestRingSchemeReport and BenchmarkOwner.
type vnodeRing struct {
	members []Member // sorted by Name
	points  []uint64 // sorted, distinct
	owners  []int32  // owners[i] = index in members of the member at points[i]
}

// newVnodeRing builds a ring with vnodes points per member. Point j of a
// member is the j-th output of the splitmix64 sequence seeded with the
// member's hash. Colliding points go to the smallest name, so the ring
// depends only on the member set (groupcache lets the later insert win).
func newVnodeRing(members []Member, vnodes int) *vnodeRing {
	sorted := slices.Clone(members)
	slices.SortFunc(sorted, func(a, b Member) int { return strings.Compare(a.Name, b.Name) })
	type pt struct {
		p uint64
		o int32
	}
	pts := make([]pt, 0, len(sorted)*vnodes)
	for i, m := range sorted {
		h := memberHash(m.Name)
		for j := 1; j <= vnodes; j++ {
			pts = append(pts, pt{bucket.Splitmix64(h + uint64(j)*ringGolden), int32(i)})
		}
	}
	slices.SortFunc(pts, func(a, b pt) int {
		if a.p != b.p {
			if a.p < b.p {
				return -1
			}
			return 1
		}
		return int(a.o - b.o)
	})
	r := &vnodeRing{members: sorted}
	for i, p := range pts {
		if i > 0 && p.p == pts[i-1].p {
			continue // collision: the smaller name, sorted first, keeps it
		}
		r.points = append(r.points, p.p)
		r.owners = append(r.owners, p.o)
	}
	return r
}

// ownerIndex returns the member owning the first point at or after h,
// wrapping around.
func (r *vnodeRing) ownerIndex(h uint64) int {
	if len(r.points) == 0 {
		return -1
	}
	i, _ := slices.BinarySearch(r.points, h)
	if i == len(r.points) {
		i = 0
	}
	return int(r.owners[i])
}

func (r *vnodeRing) owner(identity string) (Member, bool) {
	i := r.ownerIndex(IdentityHash(identity))
	if i < 0 {
		return Member{}, false
	}
	return r.members[i], true
}

// ringBenchMembers returns n members named like memberlist nodes.
func ringBenchMembers(n int) []Member {
	ms := make([]Member, n)
	for i := range ms {
		ms[i] = Member{Name: fmt.Sprintf("gw-%03d.eu-west-1", i), Addr: fmt.Sprintf("10.0.%d.%d:7946", i/250, i%250+1)}
	}
	return ms
}

// ringBenchIdentities returns n distinct 32-byte identities.
func ringBenchIdentities(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("key_%028x", bucket.Splitmix64(uint64(i)))[:32]
	}
	return ids
}

var (
	ringOwnerSink Member
	ringHashSink  uint64
)

// BenchmarkOwner compares the ring's rendezvous lookup with a vnode ring.
// The identity hash is computed in the loop (from pre-generated 32-byte
// identities) except in the -prehashed variants; hash-only is the reference
// cost of IdentityHash alone, measured in the same run.
func BenchmarkOwner(b *testing.B) {
	const nIDs = 1 << 12
	ids := ringBenchIdentities(nIDs)
	hs := make([]uint64, nIDs)
	for i, id := range ids {
		hs[i] = IdentityHash(id)
	}
	for _, n := range []int{3, 5, 10, 50, 100} {
		ms := ringBenchMembers(n)
		rr, err := NewRing(1, ms)
		if err != nil {
			b.Fatal(err)
		}
		vr := newVnodeRing(ms, 256)
		b.Run(fmt.Sprintf("members=%d", n), func(b *testing.B) {
			b.Run("hash-only", func(b *testing.B) {
				b.ReportAllocs()
				var s uint64
				for i := 0; b.Loop(); i++ {
					s += IdentityHash(ids[i&(nIDs-1)])
				}
				ringHashSink = s
			})
			b.Run("rendezvous", func(b *testing.B) {
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					ringOwnerSink, _ = rr.Owner(ids[i&(nIDs-1)])
				}
			})
			b.Run("vnodes", func(b *testing.B) {
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					ringOwnerSink, _ = vr.owner(ids[i&(nIDs-1)])
				}
			})
			b.Run("rendezvous-prehashed", func(b *testing.B) {
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					ringOwnerSink, _ = rr.OwnerOfHash(hs[i&(nIDs-1)])
				}
			})
			b.Run("vnodes-prehashed", func(b *testing.B) {
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					ringOwnerSink = vr.members[vr.ownerIndex(hs[i&(nIDs-1)])]
				}
			})
		})
	}
}

// BenchmarkNewRing is the cost of a membership change.
func BenchmarkNewRing(b *testing.B) {
	for _, n := range []int{5, 50} {
		ms := ringBenchMembers(n)
		b.Run(fmt.Sprintf("members=%d/rendezvous", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := NewRing(1, ms); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("members=%d/vnodes", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				newVnodeRing(ms, 256)
			}
		})
	}
}

// ringLoadHashes returns the IdentityHash of n synthetic identities
// "id-<i>-<seed>", hashed without allocating per identity.
func ringLoadHashes(n int, seed uint64) []uint64 {
	hs := make([]uint64, n)
	buf := make([]byte, 0, 48)
	for i := range hs {
		buf = append(buf[:0], "id-"...)
		buf = strconv.AppendUint(buf, uint64(i), 10)
		buf = append(buf, '-')
		buf = strconv.AppendUint(buf, seed, 10)
		hs[i] = xxhash.Sum64(buf)
	}
	return hs
}

package cluster

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/weir-dev/weir/bucket"
	"go.uber.org/goleak"
	"pgregory.net/rapid"
)

type ringFataler interface {
	Helper()
	Fatalf(format string, args ...any)
}

func mustRing(t ringFataler, epoch uint64, ms []Member) *Ring {
	t.Helper()
	r, err := NewRing(epoch, ms)
	if err != nil {
		t.Fatalf("NewRing: %v", err)
	}
	return r
}

func ringNames(ms []Member) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.Name
	}
	return out
}

func TestNewRingRejectsBadMembers(t *testing.T) {
	_, err := NewRing(1, []Member{{Name: "b"}, {Name: "a"}, {Name: "gw-7", Addr: "x:1"}, {Name: "gw-7", Addr: "y:1"}})
	if !errors.Is(err, ErrDuplicateMember) || !strings.Contains(err.Error(), `"gw-7"`) {
		t.Fatalf("duplicate: err = %v, want ErrDuplicateMember naming gw-7", err)
	}
	_, err = NewRing(1, []Member{{Name: "a"}, {Name: "", Addr: "10.0.0.9:7946"}})
	if !errors.Is(err, ErrEmptyMemberName) || !strings.Contains(err.Error(), "10.0.0.9:7946") {
		t.Fatalf("empty name: err = %v, want ErrEmptyMemberName naming the addr", err)
	}
}

func TestRingEmpty(t *testing.T) {
	r := mustRing(t, 7, nil)
	var nilRing *Ring
	for name, r := range map[string]*Ring{"empty": r, "nil": nilRing} {
		t.Run(name, func(t *testing.T) {
			if r.Len() != 0 || len(r.Members()) != 0 {
				t.Fatalf("Len = %d, Members = %v", r.Len(), r.Members())
			}
			if m, ok := r.Owner("alice"); ok || m != (Member{}) {
				t.Fatalf("Owner = %v, %v; want zero, false", m, ok)
			}
			if m, ok := r.OwnerOfHash(42); ok || m != (Member{}) {
				t.Fatalf("OwnerOfHash = %v, %v; want zero, false", m, ok)
			}
			if i := r.OwnerIndex(42); i != -1 {
				t.Fatalf("OwnerIndex = %d, want -1", i)
			}
			if i := r.IndexOf("a"); i != -1 {
				t.Fatalf("IndexOf = %d, want -1", i)
			}
		})
	}
	if r.Epoch() != 7 || nilRing.Epoch() != 0 {
		t.Fatalf("Epoch = %d / %d, want 7 / 0", r.Epoch(), nilRing.Epoch())
	}
}

func TestRingOneMember(t *testing.T) {
	only := Member{Name: "gw-1", Addr: "10.0.0.1:7946"}
	r := mustRing(t, 3, []Member{only})
	for _, h := range ringPropHashes()[:1000] {
		if m, ok := r.OwnerOfHash(h); !ok || m != only {
			t.Fatalf("OwnerOfHash(%#x) = %v, %v", h, m, ok)
		}
	}
	if m, ok := r.Owner(""); !ok || m != only {
		t.Fatalf(`Owner("") = %v, %v`, m, ok)
	}
}

func TestRingMembersSortedAndCopied(t *testing.T) {
	in := []Member{{"c", "3"}, {"a", "1"}, {"b", "2"}}
	r := mustRing(t, 1, in)
	in[0].Name = "zzz" // the ring keeps its own copy
	got := r.Members()
	want := []Member{{"a", "1"}, {"b", "2"}, {"c", "3"}}
	if !slices.Equal(got, want) {
		t.Fatalf("Members = %v, want %v", got, want)
	}
	got[0].Name = "mutated"
	if r.Members()[0].Name != "a" || r.Member(0).Name != "a" {
		t.Fatal("Members returned the ring's own slice")
	}
	for i, m := range want {
		if r.IndexOf(m.Name) != i {
			t.Fatalf("IndexOf(%q) = %d, want %d", m.Name, r.IndexOf(m.Name), i)
		}
	}
	if r.IndexOf("zzz") != -1 || r.IndexOf("") != -1 {
		t.Fatal("IndexOf found a non-member")
	}
}

// TestRingGolden pins IdentityHash and the owners of fixed identities over a
// fixed member set: a change of hash, member hash or score mixing moves
// identities between releases, which a rolling upgrade would feel as split
// ownership, so it must be deliberate.
func TestRingGolden(t *testing.T) {
	if got := IdentityHash(""); got != 0xef46db3751d8e999 { // xxhash64 test vector
		t.Fatalf(`IdentityHash("") = %#x`, got)
	}
	r := mustRing(t, 1, []Member{
		{"gw-e", "e"}, {"gw-a", "a"}, {"gw-c", "c"}, {"gw-b", "b"}, {"gw-d", "d"},
	})
	golden := []struct{ identity, owner string }{
		{"alice", "gw-d"},
		{"bob", "gw-d"},
		{"carol", "gw-a"},
		{"dave", "gw-d"},
		{"tenant:42", "gw-b"},
		{"api-key-0001", "gw-c"},
		{"api-key-0002", "gw-c"},
		{"10.1.2.3", "gw-c"},
		{"2001:db8::1", "gw-b"},
		{"", "gw-c"},
		{"gw-a", "gw-b"},
		{"user/ünïcödé", "gw-e"},
	}
	for _, g := range golden {
		m, ok := r.Owner(g.identity)
		if !ok || m.Name != g.owner {
			t.Errorf("Owner(%q) = %q, want %q", g.identity, m.Name, g.owner)
		}
	}
}

func TestRingOwnerDoesNotAllocate(t *testing.T) {
	r := mustRing(t, 1, ringBenchMembers(10))
	id := "key_0123456789abcdef0123456789ab"
	h := IdentityHash(id)
	var sink int
	allocs := testing.AllocsPerRun(100, func() {
		m, _ := r.Owner(id)
		sink += len(m.Name)
		m, _ = r.OwnerOfHash(h)
		sink += len(m.Name)
		sink += r.OwnerIndex(h)
		sink += r.IndexOf("gw-003.eu-west-1")
	})
	if allocs != 0 {
		t.Fatalf("Owner paths allocate %.1f times per call", allocs)
	}
	_ = sink
}

// refOwnerIndex is the definition OwnerIndex optimizes: the highest
// bucket.Splitmix64(h ^ memberHash(name)), ties to the first (smallest) name.
func refOwnerIndex(r *Ring, h uint64) int {
	best, bestScore := -1, uint64(0)
	for i, m := range r.members {
		if s := bucket.Splitmix64(h ^ memberHash(m.Name)); best < 0 || s > bestScore {
			best, bestScore = i, s
		}
	}
	return best
}

// The unrolled, precomputed scoring loop equals its definition for every
// ring size (covering the four-way steps and the remainder).
func TestRingPropMatchesDefinition(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		r := mustRing(t, 1, drawRingMembers(t, 0, 40))
		for _, h := range append(rapid.SliceOfN(rapid.Uint64(), 1, 50).Draw(t, "hashes"), 0, ^uint64(0)) {
			if got, want := r.OwnerIndex(h), refOwnerIndex(r, h); got != want {
				t.Fatalf("OwnerIndex(%#x) = %d, definition gives %d (members %q)", h, got, want, ringNames(r.members))
			}
		}
	})
}

// Equal scores (possible only if two member hashes collide) go to the
// smallest name, wherever the tie falls in the unrolled loop.
func TestRingTieGoesToSmallestName(t *testing.T) {
	for n := 1; n <= 11; n++ {
		for lo := 0; lo < n; lo++ {
			ms := make([]Member, n)
			pre := make([]uint64, n)
			for i := range ms {
				ms[i] = Member{Name: fmt.Sprintf("m%02d", i)}
				pre[i] = uint64(i + 1000) // distinct, and never the winner below
			}
			// Members lo.. all share one hash, so they tie whenever one of them wins.
			for i := lo; i < n; i++ {
				pre[i] = 7
			}
			r := &Ring{members: ms, pre: pre}
			for _, h := range ringPropHashes()[:200] {
				got := r.OwnerIndex(h)
				if got < lo && ringScore(h^(h>>30)^pre[got]) > ringScore(h^(h>>30)^7) {
					continue // a distinct member legitimately won
				}
				if got != lo {
					t.Fatalf("n=%d, tie from %d: owner %d, want %d", n, lo, got, lo)
				}
			}
		}
	}
}

// Readers of a swapped atomic.Pointer[Ring] see whole rings.
func TestRingConcurrentSwap(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	var cur atomic.Pointer[Ring]
	cur.Store(mustRing(t, 0, ringBenchMembers(3)))
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids := ringBenchIdentities(64)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				r := cur.Load()
				m, ok := r.Owner(ids[i%len(ids)])
				if !ok || r.IndexOf(m.Name) < 0 {
					t.Errorf("epoch %d: owner %v not a member", r.Epoch(), m)
					return
				}
			}
		}()
	}
	for e := uint64(1); e <= 200; e++ {
		cur.Store(mustRing(t, e, ringBenchMembers(1+int(e%7))))
	}
	close(stop)
	wg.Wait()
}

// ringPropHashes are the identity hashes the property tests place.
var ringPropHashes = sync.OnceValue(func() []uint64 { return ringLoadHashes(20000, 1) })

func drawRingMembers(t *rapid.T, minN, maxN int) []Member {
	names := rapid.SliceOfNDistinct(rapid.StringN(1, 24, -1), minN, maxN, rapid.ID[string]).Draw(t, "names")
	ms := make([]Member, len(names))
	for i, n := range names {
		ms[i] = Member{Name: n, Addr: fmt.Sprintf("10.0.0.%d:7946", i)}
	}
	return ms
}

// ringOwners returns the owner name of each hash.
func ringOwners(r *Ring, hs []uint64) []string {
	out := make([]string, len(hs))
	for i, h := range hs {
		m, _ := r.OwnerOfHash(h)
		out[i] = m.Name
	}
	return out
}

// The same member set in any order, under any epoch, gives an identical
// ring.
func TestRingPropOrderIndependent(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ms := drawRingMembers(t, 0, 30)
		perm := rapid.Permutation(ms).Draw(t, "perm")
		a := mustRing(t, 1, ms)
		b := mustRing(t, rapid.Uint64().Draw(t, "epoch"), perm)
		if !slices.Equal(a.Members(), b.Members()) {
			t.Fatalf("Members differ: %v vs %v", a.Members(), b.Members())
		}
		hs := ringPropHashes()
		if !slices.Equal(ringOwners(a, hs), ringOwners(b, hs)) {
			t.Fatal("owners differ between orders")
		}
		for _, id := range rapid.SliceOfN(rapid.String(), 1, 20).Draw(t, "identities") {
			ma, _ := a.Owner(id)
			mb, _ := b.Owner(id)
			if ma != mb {
				t.Fatalf("Owner(%q) = %v vs %v", id, ma, mb)
			}
		}
	})
}

// A join moves about 1/(n+1) of identities, and only to the joiner.
func TestRingPropJoin(t *testing.T) {
	const tol = 0.03 // absolute, on the moved fraction over 20000 identities (>= 8 sigma)
	rapid.Check(t, func(t *rapid.T) {
		all := drawRingMembers(t, 2, 31)
		j := rapid.IntRange(0, len(all)-1).Draw(t, "joiner")
		joiner := all[j]
		before := slices.Delete(slices.Clone(all), j, j+1)
		hs := ringPropHashes()
		oldO, newO := ringOwners(mustRing(t, 1, before), hs), ringOwners(mustRing(t, 2, all), hs)
		moved := 0
		for i := range hs {
			if oldO[i] != newO[i] {
				moved++
				if newO[i] != joiner.Name {
					t.Fatalf("identity %d moved %q -> %q, not to the joiner %q", i, oldO[i], newO[i], joiner.Name)
				}
			}
		}
		frac, want := float64(moved)/float64(len(hs)), 1/float64(len(all))
		if frac < want-tol || frac > want+tol {
			t.Fatalf("join of member %d moved %.4f of identities, want %.4f ± %.2f", len(all), frac, want, tol)
		}
	})
}

// A leave moves only the leaver's identities; everything else keeps its
// owner.
func TestRingPropLeave(t *testing.T) {
	const tol = 0.03
	rapid.Check(t, func(t *rapid.T) {
		all := drawRingMembers(t, 2, 31)
		l := rapid.IntRange(0, len(all)-1).Draw(t, "leaver")
		leaver := all[l]
		after := slices.Delete(slices.Clone(all), l, l+1)
		hs := ringPropHashes()
		oldO, newO := ringOwners(mustRing(t, 1, all), hs), ringOwners(mustRing(t, 2, after), hs)
		moved := 0
		for i := range hs {
			switch {
			case oldO[i] == leaver.Name:
				moved++
				if newO[i] == leaver.Name {
					t.Fatalf("identity %d still owned by the leaver", i)
				}
			case oldO[i] != newO[i]:
				t.Fatalf("identity %d moved %q -> %q though %q left", i, oldO[i], newO[i], leaver.Name)
			}
		}
		frac, want := float64(moved)/float64(len(hs)), 1/float64(len(all))
		if frac < want-tol || frac > want+tol {
			t.Fatalf("leave from %d members moved %.4f of identities, want %.4f ± %.2f", len(all), frac, want, tol)
		}
	})
}

// ringSpread places hs on r and returns the largest and smallest member
// load as a fraction of the mean.
func ringSpread(r *Ring, hs []uint64) (maxRatio, minRatio float64) {
	load := make([]int, r.Len())
	for _, h := range hs {
		load[r.OwnerIndex(h)]++
	}
	mean := float64(len(hs)) / float64(len(load))
	return float64(slices.Max(load)) / mean, float64(slices.Min(load)) / mean
}

// Balance for random member names: with 100k identities every member of a
// ring of n <= 10 gets within ±10 % of the mean (>= 10 sigma at n = 10).
// TestRingBalance pins the tighter bound over 1M identities.
func TestRingPropBalance(t *testing.T) {
	const tol = 0.10
	hs := ringLoadHashes(100_000, 2)
	worst := 0.0
	rapid.Check(t, func(t *rapid.T) {
		r := mustRing(t, 1, drawRingMembers(t, 2, 10))
		hi, lo := ringSpread(r, hs)
		if hi > 1+tol || lo < 1-tol {
			t.Fatalf("members %q: load max/mean %.4f, min/mean %.4f, want within ±%.0f%%", ringNames(r.members), hi, lo, tol*100)
		}
		worst = max(worst, hi-1, 1-lo)
	})
	t.Logf("worst deviation from the mean over the checks: %.2f%% (bound %.0f%%)", worst*100, tol*100)
}

// TestRingBalance states the balance bound over 1M identities: every member
// is within ±3 % of the mean for n <= 10 and ±6 % for n <= 50. The bounds
// are at least 8 standard deviations of the binomial sampling noise; the
// measured spread (logged) is well inside them.
func TestRingBalance(t *testing.T) {
	hs := ringLoadHashes(1_000_000, 3)
	for _, c := range []struct {
		n   int
		tol float64
	}{{2, 0.03}, {3, 0.03}, {5, 0.03}, {10, 0.03}, {50, 0.06}} {
		r := mustRing(t, 1, ringBenchMembers(c.n))
		hi, lo := ringSpread(r, hs)
		t.Logf("members=%d: max/mean %.4f, min/mean %.4f (bound ±%.0f%%)", c.n, hi, lo, c.tol*100)
		if hi > 1+c.tol || lo < 1-c.tol {
			t.Errorf("members=%d: load max/mean %.4f, min/mean %.4f, want within ±%.0f%%", c.n, hi, lo, c.tol*100)
		}
	}
}

// TestRingSchemeReport prints the measurements behind the choice of
// rendezvous hashing (see the Ring doc comment). Run with
// WEIR_RING_REPORT=1 go test -run TestRingSchemeReport -v ./cluster/
func TestRingSchemeReport(t *testing.T) {
	if os.Getenv("WEIR_RING_REPORT") == "" {
		t.Skip("set WEIR_RING_REPORT=1 to print the scheme comparison")
	}
	hs := ringLoadHashes(1_000_000, 4)
	type scheme struct {
		name string
		mk   func(ms []Member) func(h uint64) int
	}
	schemes := []scheme{
		{"rendezvous", func(ms []Member) func(uint64) int { return mustRing(t, 1, ms).OwnerIndex }},
		{"vnodes-128", func(ms []Member) func(uint64) int { return newVnodeRing(ms, 128).ownerIndex }},
		{"vnodes-256", func(ms []Member) func(uint64) int { return newVnodeRing(ms, 256).ownerIndex }},
		{"plain-xor", func(ms []Member) func(uint64) int {
			r := mustRing(t, 1, ms)
			hashes := make([]uint64, r.Len())
			for i := range hashes {
				hashes[i] = memberHash(r.Member(i).Name)
			}
			return func(h uint64) int { // rendezvous with score h^m, no mixing
				best := 0
				for i, m := range hashes {
					if h^m > h^hashes[best] {
						best = i
					}
				}
				return best
			}
		}},
	}
	for _, n := range []int{3, 5, 10, 50} {
		ms := ringBenchMembers(n)
		joined := append(slices.Clone(ms), Member{Name: "gw-joiner.eu-west-1"})
		left := slices.Delete(slices.Clone(ms), n/2, n/2+1)
		for _, s := range schemes {
			base, join, leave := s.mk(ms), s.mk(joined), s.mk(left)
			load := make([]int, n)
			movedJoin, movedLeave, wrongJoin, wrongLeave := 0, 0, 0, 0
			for _, h := range hs {
				o := base(h)
				load[o]++
				// joined: the joiner sorts last, indexes of ms are unchanged.
				if oj := join(h); oj != o {
					movedJoin++
					if oj != n {
						wrongJoin++
					}
				}
				ol := leave(h)
				if ol >= n/2 {
					ol++ // back to an index of ms
				}
				if ol != o {
					movedLeave++
					if o != n/2 {
						wrongLeave++
					}
				}
			}
			mean := float64(len(hs)) / float64(n)
			f := func(c int) float64 { return float64(c) / float64(len(hs)) }
			t.Logf("members=%-3d %-11s balance max/mean %.3f min/mean %.3f | join moved %.4f (ideal %.4f, not to joiner %d) | leave moved %.4f (ideal %.4f, not the leaver's %d)",
				n, s.name, float64(slices.Max(load))/mean, float64(slices.Min(load))/mean,
				f(movedJoin), 1/float64(n+1), wrongJoin, f(movedLeave), 1/float64(n), wrongLeave)
		}
	}
}

// TestRingDigest: the digest names the member set, not the epoch or the
// order members came in, and differs between sets.
func TestRingDigest(t *testing.T) {
	a, _ := NewRing(1, []Member{{Name: "a"}, {Name: "b"}, {Name: "c"}})
	b, _ := NewRing(9, []Member{{Name: "c", Addr: "x"}, {Name: "a"}, {Name: "b"}})
	c, _ := NewRing(1, []Member{{Name: "a"}, {Name: "b"}})
	d, _ := NewRing(1, []Member{{Name: "ab"}, {Name: "c"}})
	e, _ := NewRing(1, []Member{{Name: "a"}, {Name: "bc"}})
	if a.Digest() != b.Digest() {
		t.Errorf("same members, different digests")
	}
	if a.Digest() == c.Digest() || d.Digest() == e.Digest() {
		t.Errorf("different members, same digest")
	}
	if a.Digest() == 0 || (*Ring)(nil).Digest() != 0 {
		t.Errorf("digest 0 is reserved for no ring")
	}
}

// TestRingOwnerNameExcept: the owner without a member is the owner in the
// ring built without it, for every identity, and equals the owner for
// identities the member does not own.
func TestRingOwnerNameExcept(t *testing.T) {
	var members []Member
	for i := range 7 {
		members = append(members, Member{Name: fmt.Sprintf("n%d", i)})
	}
	full, _ := NewRing(1, members)
	for _, gone := range []string{"n0", "n3", "n6"} {
		var rest []Member
		for _, m := range members {
			if m.Name != gone {
				rest = append(rest, m)
			}
		}
		without, _ := NewRing(2, rest)
		for i := range 2000 {
			id := fmt.Sprint("id-", i)
			if got, want := full.OwnerNameExcept(id, gone), without.OwnerName(id); got != want {
				t.Fatalf("%s without %s: %s, want %s", id, gone, got, want)
			}
		}
	}
	one, _ := NewRing(1, members[:1])
	if got := one.OwnerNameExcept("x", "n0"); got != "" {
		t.Errorf("only member excepted: %q", got)
	}
	if got := strings.Join(full.Names(), ","); got != "n0,n1,n2,n3,n4,n5,n6" {
		t.Errorf("Names = %s", got)
	}
}

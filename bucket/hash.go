package bucket

import (
	"hash/maphash"
	"math/bits"
)

// Hasher turns identity strings into the 64-bit keys a Store takes.
// NewHasher hashes with a random per-process seed (hash/maphash, fast, not
// stable across processes); NewSeededHasher is deterministic across
// processes and machines, for the simulator and tests. The zero Hasher is
// NewSeededHasher(0). A Hasher is a small value, safe for concurrent use.
type Hasher struct {
	seed   maphash.Seed
	fixed  uint64
	seeded bool
}

// NewHasher returns a Hasher with a random per-process seed.
func NewHasher() Hasher { return Hasher{seed: maphash.MakeSeed()} }

// NewSeededHasher returns a Hasher whose output depends only on seed and the
// input: the same on every process, architecture and Go version.
func NewSeededHasher(seed uint64) Hasher { return Hasher{fixed: seed, seeded: true} }

// Sum returns the 64-bit hash of s.
func (h Hasher) Sum(s string) uint64 {
	if h.seeded || h.seed == (maphash.Seed{}) {
		return seededSum(h.fixed, s)
	}
	return maphash.String(h.seed, s)
}

const (
	golden = 0x9E3779B97F4A7C15
	m1     = 0xbf58476d1ce4e5b9
	m2     = 0x94d049bb133111eb
)

// Splitmix64 is the splitmix64 finalizer: a bijection on uint64 with full
// avalanche. The cluster's ring and sketches and the hitters sketch use it
// too, so there is one copy.
func Splitmix64(x uint64) uint64 {
	x ^= x >> 30
	x *= m1
	x ^= x >> 27
	x *= m2
	x ^= x >> 31
	return x
}

// Mix combines two 64-bit hashes into one with splitmix64 quality, for
// keying (rule, identity) pairs. For a fixed a it is a bijection in b and for
// a fixed b a bijection in a; Mix(a, b) != Mix(b, a) in general.
func Mix(a, b uint64) uint64 {
	return Splitmix64(Splitmix64(a+golden) ^ b)
}

// seededSum is a portable string hash: 8 bytes at a time, each word
// multiplied and xorshifted into the state, with a splitmix64 finalizer.
func seededSum(seed uint64, s string) uint64 {
	h := Splitmix64(seed+golden) ^ (uint64(len(s)) * m2)
	for len(s) >= 8 {
		k := uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
			uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
		h = mixWord(h, k)
		s = s[8:]
	}
	if len(s) > 0 {
		var k uint64
		for i := len(s) - 1; i >= 0; i-- {
			k = k<<8 | uint64(s[i])
		}
		h = mixWord(h, k^0xff<<56) // mark the tail so "a" and "a\x00" differ by more than the length
	}
	return Splitmix64(h)
}

func mixWord(h, k uint64) uint64 {
	k *= m1
	k ^= k >> 29
	k *= m2
	h ^= k
	h = bits.RotateLeft64(h, 27)*5 + 0x52dce729
	return h
}

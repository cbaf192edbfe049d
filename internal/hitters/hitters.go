// Package hitters tracks the identities that are throttled most often
// ("heavy hitters") in bounded memory, with counts that decay over time so
// that the list reflects recent activity.
//
// A Sketch is a count-min sketch (with conservative update) plus a top-K list
// keyed by the sketch's estimate. Memory is Width*Depth counters plus K
// entries, whatever the number of distinct keys. Estimates never fall below
// the true decayed count of a key (up to float64 rounding); they may exceed it
// when keys collide in the sketch.
//
// Decay is exponential: an event of weight n added at time t counts
// n * 2^(-(now-t)/HalfLife) at time now. It is implemented with a global
// scale rather than by touching counters: an event added at now is stored as
// n * 2^((now-epoch)/HalfLife), and reads divide by the same factor. Every 32
// half-lives the counters are renormalized to a new epoch, an O(Width*Depth)
// pass. Everything is deterministic for a given Config and sequence of calls;
// time is always passed in.
//
// Usage, on the rejection path of a limiter:
//
//	s := hitters.New(hitters.Config{K: 20})
//	s.Add(now.UnixNano(), identity, 1) // when a request is throttled
//	top := s.Top(now.UnixNano())        // for a status page
package hitters

import (
	"cmp"
	"container/heap"
	"math"
	"math/bits"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/weir-dev/weir/bucket"
)

// MaxKeyLen is the number of bytes of a key that are kept. Longer keys are
// truncated before counting, so keys that share their first MaxKeyLen bytes
// are counted as one, and Top reports the truncated key.
const MaxKeyLen = 256

// Defaults used for zero (or negative) Config fields.
const (
	DefaultK        = 20
	DefaultWidth    = 2048
	DefaultDepth    = 4
	DefaultHalfLife = time.Minute
)

// maxDepth bounds Config.Depth; more rows only cost time.
const maxDepth = 32

// renormHalfLives is how many half-lives may pass before counters are
// rescaled to a new epoch; the largest scale factor is 2^renormHalfLives.
const renormHalfLives = 32

// minCount is the decayed count below which Top omits an entry: about ten
// half-lives after a single event.
const minCount = 1.0 / 1024

// Config configures a Sketch. The zero Config is valid: every zero or
// negative field takes its default.
type Config struct {
	// K is the number of keys Top can report. Default DefaultK.
	K int
	// Width and Depth size the count-min sketch: Depth rows of Width
	// counters. Wider means fewer collisions (smaller overestimates), deeper
	// means less chance of a large one. Defaults DefaultWidth and
	// DefaultDepth; Depth above 32 is reduced to 32.
	Width, Depth int
	// HalfLife is the time after which a count has decayed to half.
	// Default DefaultHalfLife.
	HalfLife time.Duration
	// Seed seeds the sketch's hash. Two Sketches with the same Config and
	// the same calls give the same results. Zero is a valid seed.
	Seed uint64
}

// Entry is one heavy hitter reported by Top.
type Entry struct {
	// Key is the identity, truncated to MaxKeyLen bytes.
	Key string `json:"key"`
	// Count is the decayed estimate at the time passed to Top. It is never
	// below the key's true decayed count (up to float64 rounding) and may be
	// above it.
	Count float64 `json:"count"`
}

// Sketch counts keys approximately in bounded memory and keeps the K keys
// with the largest estimates. It is safe for concurrent use; all methods take
// one mutex, which suits its use on the rejection path rather than the
// allowed hot path.
type Sketch struct {
	mu sync.Mutex

	k, width, depth int
	halfLife        float64 // ns
	renormAfter     uint64  // ns since epoch before renormalizing
	seed            uint64

	// counts holds depth rows of width counters, in units of epoch: a
	// counter c stands for the decayed count c * 2^(-(now-epoch)/halfLife).
	counts []float64

	started bool
	epoch   int64   // ns
	last    int64   // latest time seen, ns
	scale   float64 // 2^((last-epoch)/halfLife)

	top   minHeap          // the top-K candidates, smallest estimate first
	index map[string]*item // key -> its element of top
	key   []byte           // the key being added, reused across calls
}

type item struct {
	key string
	est float64 // sketch estimate at the key's last Add, in units of epoch
	pos int     // index in top
}

// New returns an empty Sketch configured by cfg.
func New(cfg Config) *Sketch {
	if cfg.K <= 0 {
		cfg.K = DefaultK
	}
	if cfg.Width <= 0 {
		cfg.Width = DefaultWidth
	}
	if cfg.Depth <= 0 {
		cfg.Depth = DefaultDepth
	}
	cfg.Depth = min(cfg.Depth, maxDepth)
	if cfg.HalfLife <= 0 {
		cfg.HalfLife = DefaultHalfLife
	}
	renorm := uint64(math.MaxInt64)
	if cfg.HalfLife <= math.MaxInt64/renormHalfLives {
		renorm = uint64(cfg.HalfLife) * renormHalfLives
	}
	return &Sketch{
		k:           cfg.K,
		width:       cfg.Width,
		depth:       cfg.Depth,
		halfLife:    float64(cfg.HalfLife),
		renormAfter: renorm,
		seed:        cfg.Seed,
		counts:      make([]float64, cfg.Width*cfg.Depth),
		scale:       1,
		top:         make(minHeap, 0, cfg.K),
		index:       make(map[string]*item, cfg.K),
	}
}

// advance moves the clock to now (ns) and returns the current scale. A time
// earlier than one already seen is treated as that time. s.mu must be held.
func (s *Sketch) advance(now int64) float64 {
	if !s.started {
		s.started, s.epoch, s.last, s.scale = true, now, now, 1
		return 1
	}
	if now <= s.last {
		return s.scale
	}
	s.last = now
	d := uint64(now) - uint64(s.epoch) // now >= epoch, so this cannot wrap
	if d > s.renormAfter {
		s.renormalize(now, d)
		d = 0
	}
	s.scale = math.Exp2(float64(d) / s.halfLife)
	return s.scale
}

// renormalize rescales every stored value to epoch now, d ns after the old
// epoch, and drops top entries that have decayed below minCount.
func (s *Sketch) renormalize(now int64, d uint64) {
	f := math.Exp2(-float64(d) / s.halfLife)
	for i := range s.counts {
		s.counts[i] *= f
	}
	kept := s.top[:0]
	for _, it := range s.top {
		it.est *= f
		if it.est < minCount {
			delete(s.index, it.key)
			continue
		}
		kept = append(kept, it)
	}
	clear(s.top[len(kept):])
	s.top = kept
	for i, it := range s.top {
		it.pos = i
	}
	heap.Init(&s.top) // scaling keeps the order, but filtering moved elements
	s.epoch = now
}

// Add counts n events for key at time now (ns since any fixed origin, such as
// time.Time.UnixNano). Keys longer than MaxKeyLen bytes are truncated. Adding
// zero events does nothing. Counts are exact in float64 below 2^53.
func (s *Sketch) Add(now int64, key string, n uint64) {
	if n == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.key = append(s.key[:0], key...)
	s.add(now, n)
}

// AddPair counts n events for the key a + " " + b, exactly as Add would,
// without building that string unless it enters the top list: the caller's
// rejection path stays free of allocations.
func (s *Sketch) AddPair(now int64, a, b string, n uint64) {
	if n == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.key = append(append(append(s.key[:0], a...), ' '), b...)
	s.add(now, n)
}

// AddTriple counts n events for the key a + " " + b + c, exactly as Add
// would, without building that string unless it enters the top list.
func (s *Sketch) AddTriple(now int64, a, b, c string, n uint64) {
	if n == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.key = append(append(append(append(s.key[:0], a...), ' '), b...), c...)
	s.add(now, n)
}

// add counts n events for the key in s.key. s.mu must be held.
func (s *Sketch) add(now int64, n uint64) {
	key := s.key
	if len(key) > MaxKeyLen {
		key = key[:MaxKeyLen]
	}
	h1, h2 := hash(s.seed, key)
	w := float64(n) * s.advance(now)

	// Conservative update: raise each of the key's counters only as far as
	// the new estimate. Estimates still never fall below true counts, and
	// collisions inflate them less than plain count-min does.
	est := math.Inf(1)
	for r := range s.depth {
		est = min(est, s.counts[s.cell(r, h1, h2)])
	}
	est += w
	for r := range s.depth {
		c := &s.counts[s.cell(r, h1, h2)]
		*c = max(*c, est)
	}
	s.offer(key, est)
}

// cell returns the index in counts of key's counter in row r.
func (s *Sketch) cell(r int, h1, h2 uint64) int {
	hi, _ := bits.Mul64(h1+uint64(r)*h2, uint64(s.width))
	return r*s.width + int(hi)
}

// offer updates key's place in the top list given its new estimate.
func (s *Sketch) offer(key []byte, est float64) {
	if it, ok := s.index[string(key)]; ok { // no allocation for the lookup
		it.est = est
		heap.Fix(&s.top, it.pos)
		return
	}
	if len(s.top) < s.k {
		it := &item{key: string(key), est: est}
		s.index[it.key] = it
		heap.Push(&s.top, it)
		return
	}
	if it := s.top[0]; est > it.est {
		delete(s.index, it.key)
		it.key, it.est = string(key), est
		s.index[it.key] = it
		heap.Fix(&s.top, 0)
	}
}

// Top returns up to K keys with their decayed estimates at time now (ns),
// sorted by count descending and then key ascending. Entries whose count has
// decayed below 1/1024 are omitted. A time earlier than one already seen is
// treated as that time. The result is a new slice owned by the caller.
func (s *Sketch) Top(now int64) []Entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	scale := s.advance(now)
	out := make([]Entry, 0, len(s.top))
	for _, it := range s.top {
		if c := it.est / scale; c >= minCount {
			out = append(out, Entry{Key: it.key, Count: c})
		}
	}
	slices.SortFunc(out, func(a, b Entry) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return strings.Compare(a.Key, b.Key)
	})
	return out
}

// hash returns two 64-bit hashes of key for double hashing: FNV-1a from a
// seeded start, finished with the SplitMix64 mixer. h2 is odd.
func hash(seed uint64, key []byte) (h1, h2 uint64) {
	h := uint64(14695981039346656037) ^ bucket.Splitmix64(seed)
	for i := 0; i < len(key); i++ {
		h ^= uint64(key[i])
		h *= 1099511628211
	}
	return bucket.Splitmix64(h), bucket.Splitmix64(h^0x9e3779b97f4a7c15) | 1
}

// minHeap orders items by estimate, smallest first, for container/heap.
type minHeap []*item

func (h minHeap) Len() int { return len(h) }

func (h minHeap) Less(i, j int) bool {
	if h[i].est != h[j].est {
		return h[i].est < h[j].est
	}
	return h[i].key > h[j].key // evict the larger key first, matching Top's order
}

func (h minHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].pos, h[j].pos = i, j
}

func (h *minHeap) Push(x any) {
	it := x.(*item)
	it.pos = len(*h)
	*h = append(*h, it)
}

func (h *minHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return it
}

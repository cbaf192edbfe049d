package region

import (
	"math/bits"
	"strconv"
	"strings"
	"unsafe"

	"github.com/weir-dev/weir/cluster"
)

// idNames holds the run's identity names, "id-" and an index, with their
// bytes laid out in one string at a fixed power-of-two stride: name i
// starts at byte i·stride. The nodes' names ("n" and an index) are held
// the same way: the coordinator addresses its messages with the names it
// was given, and every exchange needs the index of its peer. The coordinator hands the names it was given
// back to the owner table on every decision, so index can tell a name's
// index from where its bytes lie, in a few instructions, instead of
// parsing its digits. Any other string (a copy, a foreign name) is parsed
// as before: the answer is the same either way.
type idNames struct {
	prefix string
	names  []string
	// keys[i] is cluster.KeyOf(names[i]) (identities only): the
	// coordinators need not hash a name on every decision.
	keys  []cluster.Key
	all   string // the names' bytes, name i at i<<shift
	shift uint
	// base, size and mask are all's address and length and the stride
	// less one, for index (all keeps the bytes alive; Go's heap does not
	// move them).
	base, size, mask uintptr
}

// newIDNames returns the names of n identities, with their hashes.
func newIDNames(n int) *idNames { return newIDNamesPrefix("id-", n) }

// newIDNamesPrefix returns the n identity names prefix and an index, with
// their hashes.
func newIDNamesPrefix(prefix string, n int) *idNames {
	t := newNames(prefix, n)
	t.keys = make([]cluster.Key, n)
	for i, name := range t.names {
		t.keys[i] = cluster.KeyOf(name)
	}
	return t
}

// newNames returns the n names prefix and an index (0 to n−1).
func newNames(prefix string, n int) *idNames {
	t := &idNames{prefix: prefix, names: make([]string, n)}
	width := len(prefix) + len(strconv.Itoa(max(n-1, 0)))
	t.shift = uint(bits.Len(uint(width - 1)))
	stride := 1 << t.shift
	var b strings.Builder
	b.Grow(n * stride)
	for i := range n {
		name := prefix + strconv.Itoa(i)
		b.WriteString(name)
		for range stride - len(name) {
			b.WriteByte(0)
		}
	}
	t.all = b.String()
	t.base = uintptr(unsafe.Pointer(unsafe.StringData(t.all)))
	t.size, t.mask = uintptr(len(t.all)), uintptr(stride-1)
	for i := range n {
		start := i << t.shift
		t.names[i] = t.all[start : start+len(prefix)+len(strconv.Itoa(i))]
	}
	return t
}

// index returns i when s is name i (names[i]).
func (t *idNames) index(s string) (int, bool) {
	// A string whose bytes start at name i's and whose length is name
	// i's is name i: strings do not change. Go's heap does not move, so
	// the addresses compare as integers.
	if i := t.at(s); i >= 0 {
		return i, true
	}
	return t.parse(s)
}

// at returns i when s is names[i] itself, its bytes where name i's lie,
// or -1: index's common case, small enough to inline.
func (t *idNames) at(s string) int {
	off := uintptr(unsafe.Pointer(unsafe.StringData(s))) - t.base
	if i := int(off >> t.shift); off < t.size && off&t.mask == 0 && len(s) == len(t.names[i]) {
		return i
	}
	return -1
}

// parse is index for a string that is not one of the names themselves
// (kept out of index, so that index is small enough to inline).
func (t *idNames) parse(s string) (int, bool) {
	// parseIndex accepts only the canonical name of an index, so an
	// identity it parses to i < len(names) is names[i].
	if i, ok := parseIndex(s, t.prefix); ok && i < len(t.names) {
		return i, true
	}
	return 0, false
}

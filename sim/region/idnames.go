package region

import (
	"math/bits"
	"strconv"
	"strings"
	"unsafe"
)

// idNames holds the run's identity names, "id-" and an index, with their
// bytes laid out in one string at a fixed power-of-two stride: name i
// starts at byte i·stride. The coordinator hands the names it was given
// back to the owner table on every decision, so index can tell a name's
// index from where its bytes lie, in a few instructions, instead of
// parsing its digits. Any other string (a copy, a foreign name) is parsed
// as before: the answer is the same either way.
type idNames struct {
	names []string
	all   string // the names' bytes, name i at i<<shift
	shift uint
}

// newIDNames returns the names of n identities.
func newIDNames(n int) *idNames {
	t := &idNames{names: make([]string, n)}
	width := len("id-") + len(strconv.Itoa(max(n-1, 0)))
	t.shift = uint(bits.Len(uint(width - 1)))
	stride := 1 << t.shift
	var b strings.Builder
	b.Grow(n * stride)
	for i := range n {
		name := "id-" + strconv.Itoa(i)
		b.WriteString(name)
		for range stride - len(name) {
			b.WriteByte(0)
		}
	}
	t.all = b.String()
	for i := range n {
		start := i << t.shift
		t.names[i] = t.all[start : start+len("id-")+len(strconv.Itoa(i))]
	}
	return t
}

// index returns i when s is the name of identity i (names[i]).
func (t *idNames) index(s string) (int, bool) {
	// A string whose bytes start at name i's and whose length is name
	// i's is name i: strings do not change. Go's heap does not move, so
	// the addresses compare as integers.
	off := uintptr(unsafe.Pointer(unsafe.StringData(s))) - uintptr(unsafe.Pointer(unsafe.StringData(t.all)))
	if off < uintptr(len(t.all)) && off&(1<<t.shift-1) == 0 {
		if i := int(off >> t.shift); len(s) == len(t.names[i]) {
			return i, true
		}
	}
	// parseIndex accepts only the canonical name of an index, so an
	// identity it parses to i < len(names) is names[i].
	if i, ok := parseIndex(s, "id-"); ok && i < len(t.names) {
		return i, true
	}
	return 0, false
}

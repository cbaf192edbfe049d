package region

import (
	"strconv"
	"strings"
	"testing"
)

// TestIDNamesIndex: index finds every identity's own name by where its
// bytes lie, and a copy of it (other bytes) by parsing, with the same
// answer; substrings of the shared bytes, foreign and out-of-range names
// are not identities.
func TestIDNamesIndex(t *testing.T) {
	for _, n := range []int{1, 9, 10, 11, 100, 1000, 1001} {
		ids := newIDNames(n)
		if len(ids.names) != n {
			t.Fatalf("n=%d: %d names", n, len(ids.names))
		}
		for i, name := range ids.names {
			if want := "id-" + strconv.Itoa(i); name != want {
				t.Fatalf("n=%d: name %d is %q, want %q", n, i, name, want)
			}
			if got, ok := ids.index(name); !ok || got != i {
				t.Fatalf("n=%d: index(%q) = %d, %v; want %d", n, name, got, ok, i)
			}
			if got, ok := ids.index(strings.Clone(name)); !ok || got != i {
				t.Fatalf("n=%d: index(copy of %q) = %d, %v; want %d", n, name, got, ok, i)
			}
			// A prefix of name i shares its first byte but is another
			// string: "id-1" of "id-12" is identity 1 (by parsing).
			if len(name) > 4 {
				p := name[:len(name)-1]
				want, _ := strconv.Atoi(p[3:])
				if got, ok := ids.index(p); !ok || got != want {
					t.Fatalf("n=%d: index(%q) = %d, %v; want %d", n, p, got, ok, want)
				}
			}
		}
		// A string that starts inside the shared bytes (not at a
		// name's start) parses like any other.
		if n > 1 {
			if got, ok := ids.index(ids.names[1][1:]); ok {
				t.Fatalf("n=%d: index(%q) = %d, true", n, ids.names[1][1:], got)
			}
		}
		for _, s := range []string{"", "id-", "id-01", "x-1", "id-" + strconv.Itoa(n), "n1"} {
			if got, ok := ids.index(s); ok {
				t.Fatalf("n=%d: index(%q) = %d, true", n, s, got)
			}
		}
		// All the bytes at once start at name 0's but are longer.
		if all := ids.all; len(all) > len(ids.names[0]) {
			if got, ok := ids.index(all); ok {
				t.Fatalf("n=%d: index(all) = %d, true", n, got)
			}
		}
	}
}

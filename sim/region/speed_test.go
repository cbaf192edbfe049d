package region

import (
	"strconv"
	"strings"
	"testing"
)

// TestNodeIndex: nodeIndex finds every node by its name, the region's
// own string (by its address) or a copy (parsed), and rejects names that
// are not a node's.
func TestNodeIndex(t *testing.T) {
	regionOf := func(n int) *Region {
		rg := &Region{nodeNames: newNames("n", n)}
		rg.names = rg.nodeNames.names
		return rg
	}
	rg := regionOf(1234)
	for i, name := range rg.names {
		if name != nodeName(i) {
			t.Fatalf("name %d is %q, want %q", i, name, nodeName(i))
		}
		if j, ok := rg.nodeIndex(name); !ok || j != i {
			t.Fatalf("nodeIndex(%q) = %d, %v", name, j, ok)
		}
		// A copy, so that nothing can rest on the string's address.
		if j, ok := rg.nodeIndex(string([]byte(name))); !ok || j != i {
			t.Fatalf("nodeIndex(copy of %q) = %d, %v", name, j, ok)
		}
	}
	for _, name := range []string{"", "n", "x1", "m12", "n01", "n00", "n012", "n1a", "na", "n-1", "n1234", "n99999", "N1", "n 1", "n1 "} {
		if j, ok := rg.nodeIndex(name); ok {
			t.Fatalf("nodeIndex(%q) = %d, true", name, j)
		}
	}
	small := regionOf(12)
	for _, name := range []string{"n12", "n20", "n99", rg.names[12], rg.names[99]} {
		if j, ok := small.nodeIndex(name); ok {
			t.Fatalf("12 nodes: nodeIndex(%q) = %d, true", name, j)
		}
	}
	if j, ok := small.nodeIndex("n11"); !ok || j != 11 {
		t.Fatalf("12 nodes: nodeIndex(n11) = %d, %v", j, ok)
	}
}

// FuzzParseIndex: parseIndex accepts exactly the prefix followed by
// strconv.Itoa of the index (at most 9 digits), which is what lets
// nodeIndex and ownerCache.OwnerName skip comparing the name with the one
// made for the index.
func FuzzParseIndex(f *testing.F) {
	for _, s := range []string{"n0", "n7", "n12", "n99", "n100", "n05", "n", "id-0", "id-999", "id-0999",
		"id-", "id-123456789", "id-1234567890", "n-1", "n+1", "x12", "n1a", "id-12 ", "ñ1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, prefix := range []string{"n", "id-"} {
			i, ok := parseIndex(s, prefix)
			canonical := len(s) > len(prefix) && len(s) <= len(prefix)+9 && strings.HasPrefix(s, prefix) &&
				s == prefix+strconv.Itoa(i)
			if ok && !canonical {
				t.Fatalf("parseIndex(%q, %q) = %d, true: not the canonical name", s, prefix, i)
			}
			if !ok {
				// Every canonical name parses.
				if d := strings.TrimPrefix(s, prefix); d != s {
					if n, err := strconv.Atoi(d); err == nil && n >= 0 && strconv.Itoa(n) == d && len(d) <= 9 {
						t.Fatalf("parseIndex(%q, %q) rejects the name of %d", s, prefix, n)
					}
				}
			}
		}
	})
}

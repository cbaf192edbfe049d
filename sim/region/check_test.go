package region

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestSortAdmissions: the insertion sort gives the general sort's order,
// for batches nearly in order (the common case), far out of order (the
// fallback) and with ties in time.
func TestSortAdmissions(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for trial := range 2000 {
		n := r.IntN(300)
		spread := []int64{0, 3, 50, 1_000_000}[trial%4]
		a := make([]admission, n)
		for i := range a {
			// Arrival order is seq order; times lag by up to spread.
			a[i] = admission{at: int64(i) * 2, seq: uint64(i + 1), ident: int32(r.IntN(5))}
			if spread > 0 {
				a[i].at -= r.Int64N(spread + 1)
			}
		}
		want := slices.Clone(a)
		slices.SortFunc(want, cmpAdmission)
		sortAdmissions(a)
		if !slices.Equal(a, want) {
			t.Fatalf("trial %d (n %d, spread %d): order differs from slices.SortFunc", trial, n, spread)
		}
	}
}

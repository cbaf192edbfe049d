package lease

import "slices"

// Allocate divides capacity among regions by their demands, max-min fair
// with a floor: every active region (active[i]) gets at least floor, demand
// is met in full from the smallest up while capacity lasts, and the rest is
// shared equally among the regions still wanting more. Inactive regions get
// 0. All values are tokens per window.
//
// The result never sums above capacity when len(active regions)·floor ≤
// capacity; when the floors alone do not fit, the first active regions in
// index order get a floor each until capacity runs out and the others get 0
// (a rule's validation keeps that case out: see Rule.validate). Shares are
// whole tokens; what rounding leaves over goes to the regions in index
// order, one token each, so the result is deterministic.
func Allocate(capacity, floor int64, demand []int64, active []bool) []int64 {
	n := len(demand)
	out := make([]int64, n)
	var idx []int
	for i := range n {
		if active[i] {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 || capacity <= 0 {
		return out
	}
	left := capacity
	for _, i := range idx {
		f := min(floor, left)
		out[i] = f
		left -= f
	}
	// Water-fill above the floors, smallest unmet demand first.
	slices.SortStableFunc(idx, func(a, b int) int {
		switch {
		case demand[a] < demand[b]:
			return -1
		case demand[a] > demand[b]:
			return 1
		}
		return 0
	})
	for k, i := range idx {
		want := demand[i] - out[i]
		if want <= 0 {
			continue
		}
		rest := int64(len(idx) - k) // regions not yet served, this one included
		fair := left / rest
		give := min(want, fair)
		out[i] += give
		left -= give
	}
	// What integer division left over: one token each, in index order, to
	// regions that still want more.
	for i := 0; i < n && left > 0; i++ {
		if active[i] && out[i] < demand[i] {
			out[i]++
			left--
		}
	}
	return out
}

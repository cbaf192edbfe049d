package region

import (
	"math/rand/v2"
	"testing"

	"github.com/weir-dev/weir/sim/engine"
)

// TestZipfExact: the table-fronted generator draws exactly what
// math/rand/v2's Zipf draws from the same source, over exponents, sizes
// and seeds, and its table answers most draws.
func TestZipfExact(t *testing.T) {
	for _, tc := range []struct {
		s    float64
		imax uint64
	}{{1.1, 999}, {1.1, 1}, {1.01, 99}, {1.5, 1999}, {2, 9}, {3.7, 100000}, {1.2, 200000}} {
		for seed := range uint64(3) {
			want := rand.NewZipf(rand.New(rand.NewPCG(seed, 1)), tc.s, 1, tc.imax)
			got := newZipf(engine.NewPCG(seed, 1), tc.s, 1, tc.imax)
			hits := 0
			for i := range 200_000 {
				if i%1000 == 0 { // count the cells that answer alone
					if got.cell[int(float64(i)/200_000*zipfCells)] != zipfNone {
						hits++
					}
				}
				if w, g := want.Uint64(), got.Uint64(); w != g {
					t.Fatalf("s %g imax %d seed %d draw %d: %d, want %d", tc.s, tc.imax, seed, i, g, w)
				}
			}
			if hits < 100 {
				t.Errorf("s %g imax %d: only %d of 200 sampled cells answer alone", tc.s, tc.imax, hits)
			}
		}
	}
	if newZipf(engine.NewPCG(1, 1), 1, 1, 10) != nil {
		t.Error("exponent 1: want nil, as rand.NewZipf")
	}
}

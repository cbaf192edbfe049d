package global

import (
	"math/rand/v2"
	"slices"
	"time"

	"github.com/weir-dev/weir/sim/engine"
)

// idlePoll is how often an arrival process with no demand looks again.
const idlePoll = int64(50 * time.Millisecond)

// demand sets the offered rates (and their changes) of cfg.Demand, and
// starts one arrival process per (identity, region).
func (r *run) demand(rng *rand.Rand) {
	cfg := r.cfg
	R := cfg.Regions
	total := cfg.Load * float64(cfg.Limit)
	switch cfg.Demand {
	case DemandConstant, DemandPoisson, DemandBursty:
		for id := range r.ids {
			for i := range R {
				r.rates[id][i] = total / float64(R)
			}
			r.shifted(id)
		}
	case DemandMove:
		for k := 0; time.Duration(k)*cfg.MoveEvery < cfg.Duration; k++ {
			r.s.At(start+int64(time.Duration(k)*cfg.MoveEvery), engine.EventFunc(func(*engine.Sim) {
				for id := range r.ids {
					for i := range R {
						r.rates[id][i] = 0
					}
					r.rates[id][(id+k)%R] = total
					r.shifted(id)
				}
			}))
		}
	case DemandSchedule:
		steps := slices.Clone(cfg.Schedule)
		slices.SortStableFunc(steps, func(a, b Shift) int { return int(a.At - b.At) })
		for i := 0; i < len(steps); {
			j := i
			for j < len(steps) && steps[j].At == steps[i].At {
				j++
			}
			group := steps[i:j]
			r.s.At(start+int64(group[0].At), engine.EventFunc(func(*engine.Sim) {
				for id := range r.ids {
					for _, st := range group {
						r.rates[id][st.Region] = st.Rate
					}
					r.shifted(id)
				}
			}))
			i = j
		}
	case DemandDoorman:
		r.doorman = newDoorman(r, rng)
	}
	for id := range r.ids {
		for _, g := range r.regions {
			a := &arrival{g: g, id: id}
			r.s.After(rng.Int64N(idlePoll), a)
		}
	}
}

// arrival is the request process of one (identity, region): evenly spaced
// at the offered rate, Poisson (DemandPoisson, or Config.Poisson), or a
// second's worth at once (bursty).
type arrival struct {
	g     *region
	id    int
	carry float64
}

func (a *arrival) Fire(s *engine.Sim) {
	r := a.g.r
	r.arrivalOnly, r.touched = true, a.id
	rate := r.rates[a.id][a.g.i] // tokens per window
	c := r.cfg.Cost
	if rate <= 0 {
		s.After(idlePoll, a)
		return
	}
	perNs := rate / float64(r.cfg.Window)
	var gap float64
	switch r.cfg.Demand {
	case DemandBursty:
		a.carry += perNs * float64(time.Second) / float64(c)
		n := int(a.carry)
		a.carry -= float64(n)
		for range n {
			a.g.request(a.id, c)
		}
		gap = float64(time.Second)
	case DemandPoisson:
		a.g.request(a.id, c)
		gap = s.Rand().ExpFloat64() * float64(c) / perNs
	default:
		a.g.request(a.id, c)
		gap = float64(c) / perNs
		if r.cfg.Poisson {
			gap = s.Rand().ExpFloat64() * float64(c) / perNs
		}
	}
	s.After(max(int64(gap), 1), a)
}

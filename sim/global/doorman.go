package global

import (
	"math/rand/v2"
	"time"

	"github.com/weir-dev/weir/sim/engine"
)

// Doorman's published simulation (youtube/doorman, simulation/ and
// doc/design.md), as we read its source: scenario five builds a root
// server, three region servers, three data-centre servers per region and
// five clients per data centre (45 clients) sharing resource0, capacity
// 500, with the ProportionalShare algorithm, refresh interval 8 s and
// leases of 60 s. Every client starts wanting 15; every 10 s (and once at
// creation) its wants move by a uniform ±10 %. Scenario seven runs that
// for an hour and, from the 60th second on, every 60 s picks a mishap:
// random.randint(0, 14) against the keys {5, 10, 15} of a Python 2 dict
// iterated in slot order (10, 5, 15) gives a master election in a random
// server job with probability 1/15, a spike (+100 to one random client's
// wants, for good) with 10/15, and the loss of a random job's master for
// randint(0, 60) s with 4/15. The design doc reports 96.6 % of capacity
// handed out on average after the learning mode, and over-grants that
// peak at 530.24 (106.05 %).
//
// In weir a Doorman client is demand, not a holder: a lease belongs to a
// region. The mappings: with 3 regions, each Doorman region is a weir
// region whose demand is its 15 clients' wants, and its three data centres
// are nodes of that region's cluster (the in-region slack); with 9
// regions, each data centre is a weir region with 5 clients' demand.
// Server jobs map onto weir as follows: the root job is the lease group's
// leader (a lost master is a leader crash, an election a leader change
// that costs -election); a region or data-centre job losing its master is
// a partition of the weir regions under it from the leader (with 3
// regions, a data centre's outage cuts its whole weir region: harsher
// than Doorman's); an election in a non-root job changes nothing in weir
// (the lease belongs to the region, not to the node that reports).

// Doorman's scenario constants.
const (
	doormanCapacity  = 500
	doormanWants     = 15
	doormanFraction  = 0.1
	doormanInterval  = 10 * time.Second
	doormanMishapGap = 60 * time.Second
	doormanSpike     = 100
	doormanMaxOutage = 60
)

// DoormanConfig returns the Doorman scenario seven on weir with regions
// weir regions (3 or 9, see above) for an hour: capacity 500 per second,
// global burst 50 (a tenth of a second: Doorman's capacity is a rate and
// has no burst), cost 1, accuracy 5 %. With doormanTimings the refresh
// interval and the lease are Doorman's (8 s, 60 s); otherwise weir's (1 s,
// 10 s). The averages skip the first 60 s, as Doorman's skip its learning
// mode.
func DoormanConfig(regions int, doormanTimings bool, seed uint64) Config {
	c := Config{Regions: regions, Limit: doormanCapacity, Window: time.Second, Burst: doormanCapacity / 10,
		Demand: DemandDoorman, DoormanClients: 45 / regions, Duration: time.Hour, Warmup: 60 * time.Second,
		Sample: 5 * time.Second, Skew: 200 * time.Millisecond, Seed: seed}
	if doormanTimings {
		c.Refresh, c.Lease = 8*time.Second, 60*time.Second
	}
	return c
}

type doormanDemand struct {
	r     *run
	wants [][]float64 // [region][client]
	jobs  [][]int     // per server job, the weir regions under it; nil for the root
}

func newDoorman(r *run, rng *rand.Rand) *doormanDemand {
	R := r.cfg.Regions
	d := &doormanDemand{r: r, wants: make([][]float64, R)}
	for i := range d.wants {
		d.wants[i] = make([]float64, r.cfg.DoormanClients)
		for j := range d.wants[i] {
			d.wants[i][j] = doormanWants
		}
	}
	d.jobs = append(d.jobs, nil)
	switch R {
	case 3:
		for i := range 3 {
			d.jobs = append(d.jobs, []int{i})
		}
		for i := range 9 {
			d.jobs = append(d.jobs, []int{i / 3})
		}
	case 9:
		for i := range 3 {
			d.jobs = append(d.jobs, []int{3 * i, 3*i + 1, 3*i + 2})
		}
		for i := range 9 {
			d.jobs = append(d.jobs, []int{i})
		}
	default:
		for i := range R {
			d.jobs = append(d.jobs, []int{i})
		}
	}
	d.walk(rng)
	r.s.At(start+int64(doormanInterval), engine.EventFunc(d.tick))
	r.s.At(start+int64(doormanMishapGap), engine.EventFunc(d.mishap))
	return d
}

// walk moves every client's wants by a uniform ±10 % and sets the rates.
func (d *doormanDemand) walk(rng *rand.Rand) {
	for i := range d.wants {
		for j, w := range d.wants[i] {
			d.wants[i][j] = max(w+doormanFraction*(1-2*rng.Float64())*w, 0)
		}
	}
	d.set()
}

func (d *doormanDemand) set() {
	r := d.r
	for i, ws := range d.wants {
		var sum float64
		for _, w := range ws {
			sum += w
		}
		for id := range r.ids {
			r.rates[id][i] = sum * float64(r.cfg.Window) / float64(time.Second)
		}
	}
	for id := range r.ids {
		r.shifted(id)
	}
}

func (d *doormanDemand) tick(s *engine.Sim) {
	d.walk(s.Rand())
	s.After(int64(doormanInterval), engine.EventFunc(d.tick))
}

func (d *doormanDemand) mishap(s *engine.Sim) {
	r := d.r
	rng := s.Rand()
	switch m := rng.IntN(15); {
	case m == 0:
		r.res.Elections++
		if job := d.jobs[rng.IntN(len(d.jobs))]; job == nil {
			r.crashLeader(0)
		}
	case m <= 10:
		r.res.Spikes++
		i := rng.IntN(len(d.wants))
		j := rng.IntN(len(d.wants[i]))
		d.wants[i][j] += doormanSpike
		d.set()
	default:
		r.res.Outages++
		job := d.jobs[rng.IntN(len(d.jobs))]
		down := time.Duration(rng.IntN(doormanMaxOutage+1)) * time.Second
		if job == nil {
			r.crashLeader(down)
		} else if down > 0 {
			for _, i := range job {
				r.partition(i, down)
			}
		}
	}
	s.After(int64(doormanMishapGap), engine.EventFunc(d.mishap))
}

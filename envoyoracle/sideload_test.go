package envoyoracle

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// The load generator of the side-by-side measurement: ShouldRateLimit calls
// over gRPC, spread round-robin over a system's three instances, each for
// one identity drawn from a fixed set with a few hot ones.

const (
	sideDomain = "bench"
	sideKey    = "api_key"
	// sideLimit is the limit per identity, per minute.
	sideLimit = 1000
)

// sideDescriptors is the descriptor file both systems serve: one limit per
// API key, 1000 a minute. In weir's default mode that is a shared token
// bucket with a slack of ⌊0.05·1000 ÷ 3⌋ = 16 per node; with
// envoy.fixed_window, a fixed window counted by the key's owner node.
var sideDescriptors = fmt.Sprintf(`domain: %s
descriptors:
  - key: %s
    rate_limit: {unit: minute, requests_per_unit: %d}
`, sideDomain, sideKey, sideLimit)

// idMix is the request stream's identities: hot keys take hotShare of the
// calls (over their limit within a second at saturation), the rest are
// drawn uniformly from cold keys (far under it).
type idMix struct {
	cold, hot int
	hotShare  float64
}

var sideMix = idMix{cold: 10000, hot: 16, hotShare: 0.25}

// draw returns an identity.
func (m idMix) draw(r *rand.Rand) string {
	if r.Float64() < m.hotShare {
		return fmt.Sprintf("hot-%02d", r.IntN(m.hot))
	}
	return fmt.Sprintf("key-%05d", r.IntN(m.cold))
}

// sideRequest is one call: one descriptor, api_key=id, one hit.
func sideRequest(id string) *pb.RateLimitRequest {
	return &pb.RateLimitRequest{Domain: sideDomain, HitsAddend: 1, Descriptors: []*commonv3.RateLimitDescriptor{
		{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: sideKey, Value: id}}},
	}}
}

// answerTally counts a phase's answers.
type answerTally struct {
	calls, errors, over, degraded atomic.Int64
}

// add counts one answer.
func (t *answerTally) add(resp *pb.RateLimitResponse, err error) {
	t.calls.Add(1)
	switch {
	case err != nil:
		t.errors.Add(1)
	case resp.GetOverallCode() == pb.RateLimitResponse_OVER_LIMIT:
		t.over.Add(1)
	}
	if resp.GetDynamicMetadata().GetFields()["weir.degraded"].GetBoolValue() {
		t.degraded.Add(1)
	}
}

// phaseOut is one phase's measurement. CPU times cover the measured
// interval only.
type phaseOut struct {
	Calls    int64   `json:"calls"`
	Errors   int64   `json:"errors"`
	Over     int64   `json:"over_limit"`
	Degraded int64   `json:"degraded"`
	Seconds  float64 `json:"seconds"`
	SysCPU   float64 `json:"system_cpu_s"` // the system's processes
	// ProcCPU is SysCPU process by process, in the order of the system's
	// pids (envoyproxy/ratelimit's three, then Redis).
	ProcCPU []float64 `json:"process_cpu_s"`
	GenCPU  float64   `json:"generator_cpu_s"` // the load generator (this process)
	// MachineCPU is the whole machine's busy CPU time: the system, the
	// generator and whatever else ran.
	MachineCPU float64 `json:"machine_cpu_s"`
	// Fixed load only: latencies in microseconds, from each call's
	// scheduled time; Late counts calls that found no free caller.
	P50  float64 `json:"p50_us,omitempty"`
	P99  float64 `json:"p99_us,omitempty"`
	P999 float64 `json:"p999_us,omitempty"`
	Late int64   `json:"late,omitempty"`
}

// PerSec is the answered calls per second.
func (p phaseOut) PerSec() float64 { return float64(p.Calls-p.Errors) / p.Seconds }

// PerSysCPU is the answered calls per CPU-second of the system's processes.
func (p phaseOut) PerSysCPU() float64 { return float64(p.Calls-p.Errors) / p.SysCPU }

// PerGenCPU is the answered calls per CPU-second of the load generator.
func (p phaseOut) PerGenCPU() float64 { return float64(p.Calls-p.Errors) / p.GenCPU }

// meter reads the CPU used by a system's processes and by this process.
type meter struct {
	t        *testing.T
	pids     []int
	proc0    []time.Duration
	gen0     time.Duration
	machine0 time.Duration
	start    time.Time
}

func startMeter(t *testing.T, pids []int) *meter {
	return &meter{t: t, pids: pids, proc0: pidsCPU(t, pids), gen0: selfCPU(), machine0: machineCPU(), start: time.Now()}
}

// stop fills the elapsed time and the CPU times used since the start.
func (m *meter) stop(out *phaseOut) {
	out.Seconds = time.Since(m.start).Seconds()
	out.SysCPU = 0
	out.ProcCPU = nil
	for i, d := range pidsCPU(m.t, m.pids) {
		c := (d - m.proc0[i]).Seconds()
		out.ProcCPU = append(out.ProcCPU, c)
		out.SysCPU += c
	}
	out.GenCPU = (selfCPU() - m.gen0).Seconds()
	out.MachineCPU = (machineCPU() - m.machine0).Seconds()
}

// saturate runs workers closed-loop callers for d, call n going to instance
// n mod 3, and measures the calls answered and the CPU used.
func saturate(t *testing.T, s sideSystem, workers int, d time.Duration, seed uint64) phaseOut {
	var stop atomic.Bool
	var next atomic.Uint64
	var tl answerTally
	var wg sync.WaitGroup
	m := startMeter(t, s.pids)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, uint64(w)))
			for !stop.Load() {
				c := s.clients[next.Add(1)%uint64(len(s.clients))]
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				resp, err := c.ShouldRateLimit(ctx, sideRequest(sideMix.draw(r)))
				cancel()
				tl.add(resp, err)
			}
		}()
	}
	time.Sleep(d)
	stop.Store(true)
	wg.Wait()
	var out phaseOut
	m.stop(&out)
	out.Calls, out.Errors, out.Over, out.Degraded = tl.calls.Load(), tl.errors.Load(), tl.over.Load(), tl.degraded.Load()
	return out
}

// fixedLoad offers rate calls per second, open loop, for d: a dispatcher
// releases call n at its scheduled time to a pool of callers (call n to
// instance n mod 3), and a call's latency is counted from its scheduled
// time, so a system that falls behind shows its queue in the figures
// instead of slowing the offer down.
func fixedLoad(t *testing.T, s sideSystem, rate float64, d time.Duration, callers int, seed uint64) phaseOut {
	return fixedLoadPaired(t, []sideSystem{s}, rate, d, callers, seed)[0]
}

// fixedLoadPaired is fixedLoad of several systems at once, each offered rate
// calls per second: call n goes to system n mod k (k systems), instance
// (n ÷ k) mod 3, so that they take turns call by call under one generator
// and whatever else slows the machine slows them alike. Each result's
// SysCPU is its own system's; GenCPU and MachineCPU are shared.
func fixedLoadPaired(t *testing.T, ss []sideSystem, rate float64, d time.Duration, callers int, seed uint64) []phaseOut {
	type job struct {
		at time.Time
		id string
		n  int
	}
	k := len(ss)
	jobs := make(chan job, callers*4)
	var mu sync.Mutex
	lats := make([][]float64, k)
	tls := make([]answerTally, k)
	var late atomic.Int64
	var wg sync.WaitGroup
	meters := make([]*meter, k)
	for i, s := range ss {
		meters[i] = startMeter(t, s.pids)
	}
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := make([][]float64, k)
			for j := range jobs {
				s := ss[j.n%k]
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				resp, err := s.clients[(j.n/k)%len(s.clients)].ShouldRateLimit(ctx, sideRequest(j.id))
				cancel()
				local[j.n%k] = append(local[j.n%k], float64(time.Since(j.at).Nanoseconds())/1e3)
				tls[j.n%k].add(resp, err)
			}
			mu.Lock()
			for i := range local {
				lats[i] = append(lats[i], local[i]...)
			}
			mu.Unlock()
		}()
	}
	r := rand.New(rand.NewPCG(seed, 1))
	start := time.Now()
	interval := time.Duration(float64(time.Second) / (rate * float64(k)))
	total := int(rate * d.Seconds() * float64(k))
	for i := 0; i < total; {
		due := int(time.Since(start)/interval) + 1
		for ; i < total && i < due; i++ {
			j := job{at: start.Add(time.Duration(i) * interval), id: sideMix.draw(r), n: i}
			select {
			case jobs <- j:
			default:
				late.Add(1)
				jobs <- j
			}
		}
		if i < total {
			if wait := time.Until(start.Add(time.Duration(i) * interval)); wait > 0 {
				time.Sleep(wait)
			}
		}
	}
	close(jobs)
	wg.Wait()
	out := make([]phaseOut, k)
	for i := range out {
		meters[i].stop(&out[i])
		slices.Sort(lats[i])
		tl := &tls[i]
		out[i].Calls, out[i].Errors, out[i].Over, out[i].Degraded = tl.calls.Load(), tl.errors.Load(), tl.over.Load(), tl.degraded.Load()
		out[i].P50, out[i].P99, out[i].P999 = quantile(lats[i], 0.50), quantile(lats[i], 0.99), quantile(lats[i], 0.999)
		out[i].Late = late.Load()
	}
	return out
}

// quantile of sorted xs (nearest rank); 0 for none.
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	i := int(q*float64(len(xs))+0.5) - 1
	return xs[min(max(i, 0), len(xs)-1)]
}

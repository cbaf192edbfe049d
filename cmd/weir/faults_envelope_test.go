package main

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// The envelope check of the process fault harness (faults_test.go;
// docs/overshoot.md, "The contract, per mode" and "Fault terms"). Every
// gateway serves a tight descriptor, hot, whose limit the hot callers
// exceed: region eu runs it in shared mode, region us in exact mode, both
// with on_failure: closed, so that every admission is one the owners
// account for (closed rejects while an owner is unreachable; no fail-open
// admission muddies the count). Each hot caller sends to one gateway, in
// turn for each hot identity, and records every admission with the times
// it sent the call and had the answer.
//
// An admission was decided somewhere between its call and its answer, so
// the admissions whose call and answer both lie in [a, b] were decided in
// [a, b]: the check counts those, over every interval [a, b] of at most
// hotSpan from a call to an answer, per region and identity, and holds the
// count to B + r·(b − a) + S outside the fault windows of the region's
// gateways, and to that plus each touched fault's term inside them.

// edgeDescriptors is the descriptor file every gateway serves: api_key, the
// steady load's (60 per minute, which it never reaches), and hot, the
// envelope's (hotLimit per second, burst hotLimit: envoyconf makes the
// burst requests_per_unit).
const edgeDescriptors = `domain: edge
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 60}
  - key: hot
    rate_limit: {unit: second, requests_per_unit: 20}
`

const (
	hotLimit    = 20  // per second; burst the same
	hotAccuracy = 0.5 // region eu's envoy.accuracy: a·L = 10 tokens of slack
	hotIDs      = 2   // hot identities per region, h0 and h1
	hotEvery    = 20 * time.Millisecond
	// hotSpan is the longest interval checked: longer than the longest fault
	// (a 10 s pause) with its tail, so that an interval can hold a whole
	// fault and what follows it.
	hotSpan = 20 * time.Second
	// hotLead and hotTail widen a gateway's fault window: from just before
	// the signal to past its return by failure detection and rejoin
	// (ProfileLocal: about 0.5 s), the handoff timeout (1 s), the decide
	// and call timeouts, and the views' convergence, with margin.
	hotLead = 500 * time.Millisecond
	hotTail = 5 * time.Second
	// hotGossip is G, the gossip delay of a join (ProfileLocal gossips every
	// 20 ms and pushes its state to the node it joins through at once).
	hotGossip = 500 * time.Millisecond
)

// regionModes is the mode of the imported limits per region.
var regionModes = map[string]string{"eu": "shared", "us": "exact"}

// accuracyField is the envoy.accuracy setting of a gateway config in mode.
func accuracyField(mode string) string {
	if mode == "shared" {
		return fmt.Sprintf(", accuracy: %v", hotAccuracy)
	}
	return ""
}

// hotRec is one hot call: call and answer (ns since the start), the
// gateway's index, the hot identity, and the outcome (0 OK, 1 OVER_LIMIT, 2
// error).
type hotRec struct {
	Call, Return int64
	GW, ID, Out  uint8
}

// runHot starts one hot caller per gateway, on conns.
func (h *harness) runHot(ctx context.Context, l *load, conns []rlsv3.RateLimitServiceClient, wg *sync.WaitGroup) {
	for i := range h.gws {
		wg.Go(func() {
			var recs []hotRec
			defer func() { l.mu.Lock(); l.hot = append(l.hot, recs...); l.mu.Unlock() }()
			for n := 0; ctx.Err() == nil; n++ {
				id := uint8((n + i) % hotIDs)
				call := h.now()
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				resp, err := conns[i].ShouldRateLimit(cctx, &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 1,
					Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "hot", Value: fmt.Sprintf("h%d", id)}}}}})
				cancel()
				r := hotRec{Call: call, Return: h.now(), GW: uint8(i), ID: id}
				switch {
				case err != nil:
					if ctx.Err() != nil {
						return // the run ended: not an answer
					}
					r.Out = 2
				case resp.OverallCode != rlsv3.RateLimitResponse_OK:
					r.Out = 1
				}
				recs = append(recs, r)
				time.Sleep(hotEvery)
			}
		})
	}
}

// envelopeParams are the envelope's terms for a region of n gateways in
// mode (docs/overshoot.md): B, r (tokens per ns), S = (n−1)·sᵢ(n), S_f =
// (n−1)·sᵢ(2) (the slack total while views disagree, the smallest view of
// two), and the fault terms.
type envelopeParams struct {
	b, r, s, sf          float64
	crash, join, inPause float64
}

func newEnvelopeParams(mode string, n int) envelopeParams {
	slack := func(view int) float64 {
		if mode != "shared" {
			return 0
		}
		return math.Floor(hotAccuracy * hotLimit / float64(view))
	}
	p := envelopeParams{b: hotLimit, r: hotLimit / float64(time.Second), s: float64(n-1) * slack(n), sf: float64(n-1) * slack(2)}
	p.crash = p.b + p.sf                                              // owner crash: B + S_f
	p.join = 2*p.b + p.sf + 2*math.Ceil(hotLimit*hotGossip.Seconds()) // restart or join: 2B + S_f + 2⌈r·G⌉
	p.inPause = hotInFlight * 1                                       // decisions in flight × cost c = 1
	return p
}

// hotInFlight is k, the most hot decisions of one identity a paused gateway
// can hold in flight: the region's three hot callers each have at most one
// call out, so its own caller's and, as the owner, the two it decides for
// the others.
const hotInFlight = 3

// term is the fault term of one gateway window: a kill and restart is an
// owner crash then a restart; a pause (longer than failure detection) is
// the same for the others, plus the decisions in flight in the paused
// process, whose clock reads came before the pause (docs/overshoot.md,
// "Fault terms": pause).
func (p envelopeParams) term(w window) float64 {
	t := p.crash + p.join
	if w.paused {
		t += p.inPause
	}
	return t
}

// envelopeResult is the worst of one region's hot identities.
type envelopeResult struct {
	region, mode            string
	admitted, calls, errors int
	cleanExcess, s          float64 // the worst excess outside fault windows, and its bound S
	faultExcess, faultBound float64 // inside them, the excess closest to its bound, and that bound
	faultIntervals          int
	windows                 int
}

// checkEnvelope checks the hot admissions of every region against the
// envelope and logs the figures.
func (h *harness) checkEnvelope(l *load) {
	for _, region := range []string{"eu", "us"} {
		mode := regionModes[region]
		p := newEnvelopeParams(mode, len(h.regions[region]))
		var ws []window
		inRegion := map[uint8]bool{}
		for i, g := range h.gws {
			if g.region == region {
				inRegion[uint8(i)] = true
				ws = append(ws, g.windows...)
			}
		}
		slices.SortFunc(ws, func(a, b window) int { return int(a.from - b.from) })
		res := envelopeResult{region: region, mode: mode, s: p.s, faultExcess: math.Inf(-1), cleanExcess: math.Inf(-1), windows: len(ws)}
		worstMargin := math.Inf(-1)
		for id := range uint8(hotIDs) {
			var adm [][2]int64
			for _, r := range l.hot {
				if !inRegion[r.GW] || r.ID != id {
					continue
				}
				res.calls++
				switch r.Out {
				case 0:
					adm = append(adm, [2]int64{r.Call, r.Return})
				case 2:
					res.errors++
					g := h.gws[r.GW]
					if !excused(g.windows, r.Call, r.Return, 5*time.Second) {
						h.violation("a hot RLS error from %s at t=%v..%v, outside its fault windows %v", g.name,
							time.Duration(r.Call), time.Duration(r.Return), g.windows)
					}
				}
			}
			res.admitted += len(adm)
			worstIntervals(adm, p, ws, func(a, b int64, excess, bound float64, touched bool) {
				if !touched {
					res.cleanExcess = max(res.cleanExcess, excess)
					if excess > bound+1e-9 {
						h.violation("envelope: %s h%d admitted %.0f over B + r·Δ in [%v, %v], outside fault windows, above S = %.0f",
							region, id, excess, time.Duration(a), time.Duration(b), bound)
					}
					return
				}
				res.faultIntervals++
				if excess-bound > worstMargin {
					worstMargin, res.faultExcess, res.faultBound = excess-bound, excess, bound
				}
				if excess > bound+1e-9 {
					h.violation("envelope: %s h%d admitted %.0f over B + r·Δ in [%v, %v], touching a fault, above its bound %.0f",
						region, id, excess, time.Duration(a), time.Duration(b), bound)
				}
			})
		}
		h.envelope = append(h.envelope, res)
		h.t.Logf("envelope %s (%s, %d gateways, B %.0f, r %d/s, S %.0f, S_f %.0f; terms: crash %.0f, restart %.0f, pause in flight %.0f): %d hot calls, %d admitted, %d errors; worst excess outside faults %.2f (bound S %.0f); %d gateway fault windows, %s",
			region, mode, len(h.regions[region]), p.b, hotLimit, p.s, p.sf, p.crash, p.join, p.inPause,
			res.calls, res.admitted, res.errors, res.cleanExcess, p.s, res.windows, res.faultFigure())
	}
}

// worstIntervals calls f for every interval [a, b] from an admission's call
// a to an admission's answer b, b − a ≤ hotSpan, with the count of
// admissions inside it minus B + r·(b − a), the bound that count is held
// to, and whether the interval touches one of the fault windows ws
// (widened by hotLead and hotTail). To keep the calls few, it reports per
// start a only the worst interval of each kind.
func worstIntervals(adm [][2]int64, p envelopeParams, ws []window, f func(a, b int64, excess, bound float64, touched bool)) {
	slices.SortFunc(adm, func(x, y [2]int64) int { return int(x[0] - y[0]) })
	var rets []int64
	for i := range adm {
		a := adm[i][0]
		end := a + int64(hotSpan)
		rets = rets[:0]
		for j := i; j < len(adm) && adm[j][0] <= end; j++ {
			if adm[j][1] <= end {
				rets = append(rets, adm[j][1])
			}
		}
		slices.Sort(rets)
		// The windows an interval from a can touch.
		var near []window
		for _, w := range ws {
			if w.to+int64(hotTail) >= a && w.from-int64(hotLead) <= end {
				near = append(near, w)
			}
		}
		type worst struct {
			b             int64
			excess, bound float64
			ok            bool
		}
		var clean, fault worst
		for m, b := range rets {
			excess := float64(m+1) - p.b - p.r*float64(b-a)
			bound := p.s
			touched := false
			for _, w := range near {
				if w.from-int64(hotLead) <= b && w.to+int64(hotTail) >= a {
					touched = true
					bound += p.term(w)
				}
			}
			if touched {
				if !fault.ok || excess-bound > fault.excess-fault.bound {
					fault = worst{b, excess, bound, true}
				}
			} else if !clean.ok || excess > clean.excess {
				clean = worst{b, excess, bound, true}
			}
		}
		if clean.ok {
			f(a, clean.b, clean.excess, clean.bound, false)
		}
		if fault.ok {
			f(a, fault.b, fault.excess, fault.bound, true)
		}
	}
}

// faultFigure says the excess closest to its bound over the intervals
// touching a fault window.
func (r envelopeResult) faultFigure() string {
	if r.faultIntervals == 0 {
		return "no interval touching a fault"
	}
	return fmt.Sprintf("touching faults %.2f of %.0f", r.faultExcess, r.faultBound)
}

// envelopeSummary is one line per region for the run's summary.
func (h *harness) envelopeSummary() string {
	var s []string
	for _, r := range h.envelope {
		s = append(s, fmt.Sprintf("%s %s: outside faults %.2f of %.0f, %s", r.region, r.mode, r.cleanExcess, r.s, r.faultFigure()))
	}
	return strings.Join(s, "; ")
}

// TestEnvelopeChecker shows the envelope check can fail: hand-made
// admissions one past B + r·Δ (+ S) are caught outside a fault window and
// excused by a fault's term inside one, and an admission counts only in
// intervals holding both its call and its answer.
func TestEnvelopeChecker(t *testing.T) {
	ms := int64(time.Millisecond)
	worst := func(mode string, adm [][2]int64, ws []window) (clean, fault, bound float64) {
		clean, fault = math.Inf(-1), math.Inf(-1)
		worstIntervals(adm, newEnvelopeParams(mode, 3), ws, func(a, b int64, excess, bd float64, touched bool) {
			if touched {
				if excess > fault {
					fault, bound = excess, bd
				}
			} else {
				clean = max(clean, excess)
			}
		})
		return clean, fault, bound
	}
	// B + 1 admissions within 1 ms, at t = 1 s: one past the burst.
	burst := func(at, n int64) [][2]int64 {
		var adm [][2]int64
		for i := range n {
			adm = append(adm, [2]int64{at + i*ms/100, at + i*ms/100 + ms/2})
		}
		return adm
	}
	if clean, _, _ := worst("exact", burst(1000*ms, hotLimit+1), nil); clean < 0.9 || clean > 1 {
		t.Errorf("exact, B+1 at once: worst excess %.3f, want about 1 (above S = 0)", clean)
	}
	if clean, _, _ := worst("shared", burst(1000*ms, hotLimit+7), nil); clean <= newEnvelopeParams("shared", 3).s {
		t.Errorf("shared, B+S+1 at once: worst excess %.3f, want above S", clean)
	}
	// The same inside a gateway's fault window: within its term.
	ws := []window{{from: 900 * ms, to: 1100 * ms}}
	clean, fault, bound := worst("exact", burst(1000*ms, hotLimit+1), ws)
	if !math.IsInf(clean, -1) || fault < 0.9 || fault > bound {
		t.Errorf("exact, B+1 in a fault window: clean %.3f, fault %.3f (bound %.0f): want no clean interval, the excess within the term", clean, fault, bound)
	}
	// B admissions, then one whose call came 2 s before them and whose
	// answer came with them: decided anywhere in those 2 s, it is counted
	// only over intervals of 2 s, where refill pays for it.
	adm := append(burst(5000*ms, hotLimit), [2]int64{3000 * ms, 5000*ms + ms})
	if clean, _, _ := worst("exact", adm, nil); clean > 0 {
		t.Errorf("a slow answer: worst excess %.3f, want ≤ 0", clean)
	}
}

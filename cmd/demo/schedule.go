package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/weir-dev/weir/ops"
	"github.com/weir-dev/weir/quota"
)

// The tightened api-per-key: the limit api-strict-trial tried in shadow
// mode. PUT replaces a rule whole, so the body repeats every field.
const (
	tightLimit = 300
	tightBurst = 10
	tightBody  = `{"description": "Every API key (else the client IP), 5 requests per second with bursts of 10; a write costs 5",
 "match": {"prefix": "/api"}, "key": ["header:X-API-Key", "ip"], "limit": 300, "window": "1m", "burst": 10,
 "cost_by_method": {"POST": 5}}`
	tightRule = "api-per-key"
)

// minScheduleRun is the shortest run the cluster's schedule fits in.
const minScheduleRun = 10 * time.Second

// scheduler runs the mid-run steps, each at a fixed fraction of the run,
// prints each as it happens and keeps what the summary needs.
type scheduler struct {
	f     *fleet
	out   *printer
	start time.Time
	run   time.Duration

	mu       sync.Mutex
	failures []string
	// The rule change: the PUT was sent at putAt (unix ns); every live
	// node ran the new version at allAt. Zero when it did not happen.
	putAt, allAt int64
	// Leader failover: who was killed, who took over, how long it took.
	killedLeader, newLeader string
	election                time.Duration
	// changes are the ring changes the schedule made (a node leaving,
	// a node joining again): the envelope adds their fault terms to the
	// intervals that overlap them.
	changes []ringChange
}

// ringChanged records a ring change of name that began at t0 and was
// settled (every live node's ring agreed again) at settled; it returns how
// long that took.
func (s *scheduler) ringChanged(name string, join bool, t0, settled time.Time) time.Duration {
	s.mu.Lock()
	s.changes = append(s.changes, ringChange{region: s.f.regionOf(name), node: name, join: join, from: t0.UnixNano(), settled: settled.UnixNano()})
	s.mu.Unlock()
	return settled.Sub(t0)
}

// ringChanges returns the ring changes made so far.
func (s *scheduler) ringChanges() []ringChange {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.changes)
}

func (s *scheduler) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	s.mu.Lock()
	s.failures = append(s.failures, msg)
	s.mu.Unlock()
	s.out.event("FAILED: %s", msg)
}

// at waits until fraction frac of the run; false if the run ended first.
func (s *scheduler) at(ctx context.Context, frac float64) bool {
	d := time.Until(s.start.Add(time.Duration(frac * float64(s.run))))
	if d <= 0 {
		return ctx.Err() == nil
	}
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// runSchedule is the cluster's schedule: a node stops and restarts, a rule
// is tightened through the admin API, the partner's traffic shifts, the
// lease leader is killed, and the killed voter comes back. A single node
// only has the rule change (through SetRules: it has no lease group).
func (s *scheduler) runSchedule(ctx context.Context, initial []quota.Rule) {
	if !s.f.clustered {
		if s.at(ctx, 0.4) {
			s.tightenLocal(initial)
		}
		return
	}
	if s.run < minScheduleRun {
		s.out.event("the schedule needs -duration %v or more: no node is stopped, no rule changed", minScheduleRun)
		return
	}
	steps := []struct {
		frac float64
		name string
		do   func()
	}{
		{0.15, "stop a node", func() { s.stopNode() }},
		{0.25, "restart it", func() { s.restartNode() }},
		{0.33, "tighten a rule", func() { s.tighten() }},
		{0.40, "", func() {
			if len(s.f.regions) == 2 {
				s.out.event("the partner's traffic starts moving from eu to us (80/20 → 20/80 by 60 %% of the run)")
			}
		}},
		{0.60, "", func() {
			if len(s.f.regions) == 2 {
				s.out.event("the partner's traffic has moved: 80 %% in us")
			}
		}},
		{0.68, "kill the lease leader", func() { s.killLeader() }},
		{0.85, "restart the killed voter", func() { s.restartVoter() }},
	}
	for _, st := range steps {
		if !s.at(ctx, st.frac) {
			if st.name != "" {
				s.fail("the run ended before the step %q (interrupted, or twice -duration passed)", st.name)
			}
			continue
		}
		st.do()
	}
}

// stopTarget is the node the schedule stops and restarts: the last node of
// the last region that is not a voter and leaves its region a live node.
func (s *scheduler) stopTarget() string {
	r := s.f.regions[len(s.f.regions)-1]
	names := s.f.names[r]
	if len(names) < 2 {
		return ""
	}
	for i := len(names) - 1; i >= 0; i-- {
		if !s.f.isVoter(names[i]) {
			return names[i]
		}
	}
	return ""
}

func (s *scheduler) stopNode() {
	name := s.stopTarget()
	if name == "" {
		s.out.event("no node to stop and restart: every region needs a live node, and voters are kept for the leader step (use -nodes 2 or more)")
		return
	}
	t0 := time.Now()
	if err := s.f.stop(name); err != nil {
		s.fail("stopping %s: %v", name, err)
		return
	}
	stopped := time.Since(t0)
	waitFor(stepBound, func() bool { return s.f.convergedWith(nil) })
	g := s.ringChanged(name, false, t0, time.Now())
	s.out.event("%s stopped in %v: Close is graceful (it hands its buckets to their next owners and reports its unconfirmed spend, then leaves the ring); every ring agreed %v after the stop began",
		name, stopped.Round(time.Millisecond), g.Round(time.Millisecond))
}

func (s *scheduler) restartNode() {
	name := s.stopTarget()
	if name == "" || s.f.get(name) != nil {
		return
	}
	s.restart(name)
}

// restart starts name again under the same name and puts it back in the
// rotation once its region's ring has it and it runs the newest rules.
func (s *scheduler) restart(name string) bool {
	t0 := time.Now()
	g, err := s.f.start(name)
	if err != nil {
		s.fail("restarting %s: %v", name, err)
		return false
	}
	started := time.Since(t0)
	// Into the clients' rotation only once its region's ring has it and
	// it runs the newest rules: until then its ring is itself alone, so it
	// would decide every identity as its owner with a full bucket (a load
	// balancer's readiness check does the same job).
	_, hi := s.f.rulesVersion()
	ok := waitFor(stepBound, func() bool { return s.f.convergedWith(g) && g.node.Status().RulesVersion >= hi })
	if !ok {
		s.f.retire(g)
		s.fail("%s restarted but its region did not converge within %v (members %v, rules v%d)", name, stepBound, ops.Members(g.node), g.node.Status().RulesVersion)
		return false
	}
	s.ringChanged(name, true, t0, time.Now())
	s.f.enter(g)
	s.out.event("%s restarted under the same name (New took %v): in %s's ring with rules v%d %v after the restart, then back in rotation; gateway %s",
		name, started.Round(time.Millisecond), g.region, g.node.Status().RulesVersion, time.Since(t0).Round(time.Millisecond), g.base)
	return true
}

// tighten changes api-per-key through the authenticated admin API of one
// gateway (a lease client when there is one, so the write is forwarded to
// the leader) and waits until every live node runs the new version.
func (s *scheduler) tighten() {
	var via *gateway
	for _, g := range s.f.gateways() {
		if via == nil || (via.voter && !g.voter) {
			via = g
		}
	}
	url := via.base + "/v1/rules/" + tightRule
	// Without the token: refused, nothing changes. The node's warning
	// about it is expected.
	x := s.f.expected.expect("unauthenticated admin request refused", "refused PUT without a token (the demo's check that the admin API wants one)",
		"refused PUTs without a token (the demo's check that the admin API wants one)")
	code, _, err := putRule(url, "", s.f.tag)
	s.f.expected.end(x, time.Second)
	if err != nil || code != http.StatusUnauthorized {
		s.fail("an unauthenticated PUT %s answered %d (%v), want 401", url, code, err)
		return
	}
	_, before := s.f.rulesVersion()
	t0 := time.Now()
	code, body, err := putRule(url, s.f.token, s.f.tag)
	if err != nil || code != http.StatusOK {
		s.fail("PUT %s: %d %v %s", url, code, err, body)
		return
	}
	committed := time.Since(t0)
	want := before + 1
	ok := waitFor(stepBound, func() bool {
		lo, _ := s.f.rulesVersion()
		return lo >= want
	})
	all := time.Since(t0)
	if !ok {
		lo, _ := s.f.rulesVersion()
		s.fail("rule version %d not on every node %v after the PUT (lowest v%d)", want, stepBound, lo)
		return
	}
	s.mu.Lock()
	s.putAt, s.allAt = t0.UnixNano(), t0.Add(all).UnixNano()
	s.mu.Unlock()
	s.out.event("%s tightened to %d/1m burst %d: PUT /v1/rules/%s on %s with the bearer token (a PUT without it was refused with 401, as it must be) → v%d, committed in %v, running on all %d nodes %v after the PUT",
		tightRule, tightLimit, tightBurst, tightRule, via.name, want, committed.Round(time.Millisecond), len(s.f.gateways()), all.Round(time.Millisecond))
}

// tightenLocal is the single node's rule change: Node.SetRules.
func (s *scheduler) tightenLocal(initial []quota.Rule) {
	g := s.f.gateways()[0]
	rules := tightened(initial)
	t0 := time.Now()
	if err := g.node.SetRules(rules); err != nil {
		s.fail("SetRules: %v", err)
		return
	}
	s.mu.Lock()
	s.putAt, s.allAt = t0.UnixNano(), time.Now().UnixNano()
	s.mu.Unlock()
	s.out.event("%s tightened to %d/1m burst %d through Node.SetRules (a single node has no lease group, so no admin API) → v%d",
		tightRule, tightLimit, tightBurst, g.node.Status().RulesVersion)
}

// tightened returns rules with api-per-key tightened as tightBody says.
func tightened(rules []quota.Rule) []quota.Rule {
	out := append([]quota.Rule(nil), rules...)
	for i := range out {
		if out[i].ID == tightRule {
			out[i].Limit, out[i].Burst = tightLimit, tightBurst
			out[i].Description = "Every API key (else the client IP), 5 requests per second with bursts of 10; a write costs 5"
		}
	}
	return out
}

// putRule sends the tightened rule to url, with the bearer token unless it
// is empty, as one of the demo's own requests (tag).
func putRule(url, token, tag string) (int, string, error) {
	req, err := http.NewRequest(http.MethodPut, url, strings.NewReader(tightBody))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(demoHeader, tag)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	c := &http.Client{Timeout: stepBound}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, strings.TrimSpace(string(b)), nil
}

// killLeader stops the voter that leads the lease group and waits for the
// others to elect a new leader.
func (s *scheduler) killLeader() {
	if len(s.f.voters) < 3 {
		s.out.event("the lease group has one voter: killing it would stop the group, so its leader is not killed (use 3 nodes or more)")
		return
	}
	ldr, ok := s.f.leader()
	if !ok {
		s.fail("no lease leader to kill")
		return
	}
	// Until a new leader is elected, the owners' reports fail: their
	// warnings are expected, for as long as a report in flight at the
	// election may take to fail.
	s.out.event("the lease leader %s is killed; lease reports fail until a new leader is elected — expected (their warnings are counted, not shown)", ldr)
	x := s.f.expected.expect("lease group: report failed", "warning of lease reports failing while the lease leader was down",
		"warnings of lease reports failing while the lease leader was down")
	defer s.f.expected.end(x, 3*leaseRefresh)
	t0 := time.Now()
	if err := s.f.stop(ldr); err != nil {
		s.fail("stopping the lease leader %s: %v", ldr, err)
		return
	}
	// While there is no leader, the owners keep enforcing the leases they
	// hold (a lease outlives an election): count them on the way.
	var next string
	minLeased, maxFallback := -1, 0
	var settled, elected time.Time
	waitFor(stepBound, func() bool {
		if settled.IsZero() && s.f.convergedWith(nil) {
			settled = time.Now()
		}
		leased, fallback := s.f.globalKeys()
		if minLeased < 0 || leased < minLeased {
			minLeased = leased
		}
		maxFallback = max(maxFallback, fallback)
		for _, g := range s.f.gateways() {
			if lg := leaseGroup(g.node); lg != nil && lg.IsLeader() {
				if elected.IsZero() {
					next, elected = g.name, time.Now()
				}
				return !settled.IsZero()
			}
		}
		return false
	})
	took := elected.Sub(t0)
	if settled.IsZero() {
		settled = time.Now() // not converged within stepBound: counted to now
	}
	s.ringChanged(ldr, false, t0, settled)
	if elected.IsZero() {
		s.fail("no new lease leader %v after %s was killed", stepBound, ldr)
		return
	}
	s.mu.Lock()
	s.killedLeader, s.newLeader, s.election = ldr, next, took
	s.mu.Unlock()
	meanwhile := fmt.Sprintf("during the election the owners kept enforcing the leases they held (global identities on a lease: at least %d; on the fallback: at most %d)",
		max(minLeased, 0), maxFallback)
	if maxFallback > 0 {
		meanwhile += "; an identity the killed node owned moved to a new owner, which enforces the fallback until its first grant"
	}
	s.out.event("%s elected lease leader %v after %s was killed at t=%.1fs (its gateway closed; Raft gets no leadership transfer, so the others see a crash); %s",
		next, took.Round(time.Millisecond), ldr, t0.Sub(s.start).Seconds(), meanwhile)
}

func (s *scheduler) restartVoter() {
	s.mu.Lock()
	name := s.killedLeader
	s.mu.Unlock()
	if name == "" || s.f.get(name) != nil {
		return
	}
	if s.restart(name) {
		s.out.event("%s is a voter again (its Raft log and rules came back from its data directory)", name)
	}
}

// change returns the rule change's times, zero if none.
func (s *scheduler) change() (putAt, allAt int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.putAt, s.allAt
}

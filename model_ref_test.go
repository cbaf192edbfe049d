package weir_test

import (
	"fmt"
	"math/big"
	"path"
	"strings"
	"time"

	"github.com/weir-dev/weir/quota"
)

// This file is the reference limiter the model test (model_test.go) holds
// the Node to: per rule and per identity an exact bucket of the rule's
// algorithm, written for clarity rather than speed (tokens as big.Rat,
// logs as plain lists), following the documented semantics of docs/rules.md
// and of rule changes (docs/rules.md, "Rule changes"). It has no key cap.

// refKey names one bucket: a rule incarnation and an identity within the
// namespace of the key source that produced it ("ip", "user",
// "header:X-Api-Key", or "" for the global bucket and for requests with no
// identity), so that a header value never shares a bucket with an IP or a
// user of the same text.
type refKey struct {
	rule string
	inc  int
	src  string
	id   string
}

func (k refKey) String() string {
	if k.src == "" {
		return fmt.Sprintf("%s#%d/global", k.rule, k.inc)
	}
	return fmt.Sprintf("%s#%d/%s=%q", k.rule, k.inc, k.src, k.id)
}

// refParams are the limits one bucket is under: a rule, an override or a
// tier, after the documented defaults.
type refParams struct {
	alg      quota.Algorithm
	limit    int64
	burst    int64
	window   int64 // ns
	maxDelay int64 // ns, leaky_bucket only
}

// interval is the emission interval of gcra and leaky_bucket, ceil(W/L) ns
// (docs/rules.md: rounded up so that a rule never admits more than stated).
func (p refParams) interval() int64 { return (p.window + p.limit - 1) / p.limit }

// refEntry is one admission in a sliding log.
type refEntry struct{ at, cost int64 }

// refState is one bucket. Only the fields of p.alg are used.
type refState struct {
	p refParams
	// gcra: tokens held at time at (never above burst).
	tokens *big.Rat
	at     int64
	// fixed_window (start, end, cur) and sliding_window (start, prev, cur).
	start, end int64
	prev, cur  int64
	// sliding_log: the admissions still in view or not yet dropped.
	log []refEntry
	// leaky_bucket: when the queue ahead of a new request has drained.
	dep int64
	// concurrency: requests in flight, and the epoch their releases belong to.
	inflight int64
	epoch    int
	// written is the state as the Node's store still holds it when a rule
	// change converted this one and no decision has touched the bucket
	// since (the Node converts on the next decision): what the key cap
	// measures the bucket's debt by. nil once a decision has rewritten it.
	written *refState
}

func rat(a, b int64) *big.Rat { return big.NewRat(a, b) }

func ratInt(a int64) *big.Rat { return new(big.Rat).SetInt64(a) }

// floorRat is ⌊x⌋ for x >= 0.
func floorRat(x *big.Rat) int64 {
	q := new(big.Int).Quo(x.Num(), x.Denom())
	if x.Sign() < 0 && new(big.Int).Mul(q, x.Denom()).Cmp(x.Num()) != 0 {
		q.Sub(q, big.NewInt(1))
	}
	return q.Int64()
}

// ceilRat is ⌈x⌉ for x >= 0, saturating at the largest int64.
func ceilRat(x *big.Rat) int64 {
	q, r := new(big.Int).QuoRem(x.Num(), x.Denom(), new(big.Int))
	if r.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	if !q.IsInt64() {
		return 1<<63 - 1
	}
	return q.Int64()
}

func ceilDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a > 0) == (b > 0) {
		q++
	}
	return q
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// freshState is a bucket that was never used: full, nothing logged.
func freshState(p refParams, now int64, epoch int) *refState {
	s := &refState{p: p, epoch: epoch}
	switch p.alg {
	case quota.AlgorithmGCRA:
		s.tokens, s.at = ratInt(p.burst), now
	case quota.AlgorithmFixedWindow, quota.AlgorithmSlidingWindow:
		s.start = floorDiv(now, p.window) * p.window
		s.end = s.start + p.window
	}
	return s
}

// gcraTokens is what a token bucket holds at now: refilled by one token per
// interval since at, capped at the burst.
func (s *refState) gcraTokens(now int64) *big.Rat {
	x := new(big.Rat).Add(s.tokens, rat(now-s.at, s.p.interval()))
	if b := ratInt(s.p.burst); x.Cmp(b) > 0 {
		x = b
	}
	return x
}

// roll brings fixed and sliding windows up to now.
func (s *refState) roll(now int64) {
	w := s.p.window
	switch s.p.alg {
	case quota.AlgorithmFixedWindow:
		if now >= s.end || s.cur == 0 {
			s.start = floorDiv(now, w) * w
			s.end, s.cur = s.start+w, 0
		}
	case quota.AlgorithmSlidingWindow:
		if s.prev == 0 && s.cur == 0 {
			s.start = floorDiv(now, w) * w
			return
		}
		if now < s.start+w {
			return
		}
		start := floorDiv(now, w) * w
		if start == s.start+w {
			s.prev, s.cur = s.cur, 0
		} else {
			s.prev, s.cur = 0, 0
		}
		s.start = start
	case quota.AlgorithmSlidingLog:
		kept := s.log[:0]
		for _, e := range s.log {
			if e.at > now-w {
				kept = append(kept, e)
			}
		}
		s.log = kept
	}
}

// slidingWeighted is the previous window's count weighted by the share of
// it still in view, rounded up.
func (s *refState) slidingWeighted(now int64) int64 {
	e := min(max(now-s.start, 0), s.p.window)
	return ceilDiv(s.prev*(s.p.window-e), s.p.window)
}

func (s *refState) logTotal() int64 {
	var t int64
	for _, e := range s.log {
		t += e.cost
	}
	return t
}

// refVerdict is what one bucket says about one request.
type refVerdict struct {
	allowed   bool
	remaining int64 // after the request (charged or not)
	uncharged int64 // remaining when the request is not charged (another rule rejected it)
	delay     int64 // leaky_bucket
}

// decide reports whether the bucket admits cost at now and charges it when
// charge is set and it does. The state is brought up to now either way.
func (s *refState) decide(now, cost int64, charge bool) refVerdict {
	p := s.p
	s.roll(now)
	var v refVerdict
	switch p.alg {
	case quota.AlgorithmGCRA:
		x := s.gcraTokens(now)
		v.allowed = cost <= p.burst && x.Cmp(ratInt(cost)) >= 0
		if v.allowed && charge {
			x = new(big.Rat).Sub(x, ratInt(cost))
		}
		s.tokens, s.at = x, now
		v.remaining = max(floorRat(x), 0)
	case quota.AlgorithmFixedWindow:
		v.allowed = cost <= p.limit && s.cur+cost <= p.limit
		if v.allowed && charge {
			s.cur += cost
		}
		v.remaining = max(p.limit-s.cur, 0)
	case quota.AlgorithmSlidingWindow:
		w := s.slidingWeighted(now)
		v.allowed = cost <= p.limit && w+s.cur+cost <= p.limit
		if v.allowed && charge {
			s.cur += cost
		}
		v.remaining = max(p.limit-w-s.cur, 0)
	case quota.AlgorithmSlidingLog:
		t := s.logTotal()
		v.allowed = cost <= p.limit && t+cost <= p.limit
		if v.allowed && charge {
			s.log = append(s.log, refEntry{at: now, cost: cost})
			t += cost
		}
		v.remaining = max(p.limit-t, 0)
	case quota.AlgorithmLeakyBucket:
		start := max(s.dep, now)
		v.allowed = start-now <= p.maxDelay
		if v.allowed {
			v.delay = start - now
			if charge {
				s.dep = start + cost*p.interval()
			}
		}
		v.remaining = -1 // not compared
	case quota.AlgorithmConcurrency:
		v.allowed = cost <= p.limit && s.inflight+cost <= p.limit
		if v.allowed && charge {
			s.inflight += cost
		}
		v.remaining = max(p.limit-s.inflight, 0)
	}
	return v
}

// spent is what the bucket has spent at now, in tokens: what an eviction
// forgives, and what an algorithm change carries.
func (s *refState) spent(now int64) *big.Rat {
	c := s.clone()
	c.roll(now)
	p := s.p
	switch p.alg {
	case quota.AlgorithmGCRA:
		return new(big.Rat).Sub(ratInt(p.burst), c.gcraTokens(now))
	case quota.AlgorithmFixedWindow:
		return ratInt(c.cur)
	case quota.AlgorithmSlidingWindow:
		return ratInt(c.slidingWeighted(now) + c.cur)
	case quota.AlgorithmSlidingLog:
		return ratInt(c.logTotal())
	case quota.AlgorithmLeakyBucket:
		return rat(max(c.dep-now, 0), p.interval())
	default:
		return ratInt(c.inflight)
	}
}

// storeOf names the Node's store that keeps an algorithm's buckets.
func storeOf(a quota.Algorithm) string { return string(a) }

// debt is what the bucket owes as its store measures it at the key cap:
// the time until it is full again for gcra (spend × T) and leaky_bucket
// (the queue's time to drain), its tokens for the others.
func (s *refState) debt(now int64) *big.Rat {
	switch s.p.alg {
	case quota.AlgorithmGCRA, quota.AlgorithmLeakyBucket:
		return new(big.Rat).Mul(s.spent(now), ratInt(s.p.interval()))
	default:
		return s.spent(now)
	}
}

// noteFlood records what a rotating identity's bucket owes now.
func (l *refLimiter) noteFlood(s *refState, now int64) {
	d, k := s.debt(now), storeOf(s.p.alg)
	if f := l.floodDebt[k]; f == nil || d.Cmp(f) > 0 {
		l.floodDebt[k] = d
	}
}

// idle reports whether the bucket equals a fresh one at now.
func (s *refState) idle(now int64) bool {
	if s.p.alg == quota.AlgorithmConcurrency {
		return s.inflight == 0
	}
	return s.spent(now).Sign() == 0
}

func (s *refState) clone() *refState {
	c := *s
	if s.tokens != nil {
		c.tokens = new(big.Rat).Set(s.tokens)
	}
	c.log = append([]refEntry(nil), s.log...)
	return &c
}

// equal reports whether two buckets behave the same from now on.
func (s *refState) equal(o *refState, now int64) bool {
	a, b := s.clone(), o.clone()
	a.roll(now)
	b.roll(now)
	if a.p != b.p || a.epoch != b.epoch {
		return false
	}
	switch a.p.alg {
	case quota.AlgorithmGCRA:
		return a.gcraTokens(now).Cmp(b.gcraTokens(now)) == 0
	case quota.AlgorithmFixedWindow:
		return a.cur == b.cur && (a.cur == 0 || a.end == b.end)
	case quota.AlgorithmSlidingWindow:
		return a.prev == b.prev && a.cur == b.cur && (a.prev+a.cur == 0 || a.start == b.start)
	case quota.AlgorithmSlidingLog:
		return fmt.Sprint(a.log) == fmt.Sprint(b.log)
	case quota.AlgorithmLeakyBucket:
		return max(a.dep, now) == max(b.dep, now)
	default:
		return a.inflight == b.inflight
	}
}

func (s *refState) String() string {
	now := s.at
	switch s.p.alg {
	case quota.AlgorithmGCRA:
		return fmt.Sprintf("gcra %d/%v burst %d: %s tokens at %d", s.p.limit, time.Duration(s.p.window), s.p.burst, s.tokens.FloatString(3), now)
	case quota.AlgorithmFixedWindow:
		return fmt.Sprintf("fixed %d/%v: %d in [%d, %d)", s.p.limit, time.Duration(s.p.window), s.cur, s.start, s.end)
	case quota.AlgorithmSlidingWindow:
		return fmt.Sprintf("sliding %d/%v: prev %d cur %d from %d", s.p.limit, time.Duration(s.p.window), s.prev, s.cur, s.start)
	case quota.AlgorithmSlidingLog:
		return fmt.Sprintf("log %d/%v: %v", s.p.limit, time.Duration(s.p.window), s.log)
	case quota.AlgorithmLeakyBucket:
		return fmt.Sprintf("leaky %d/%v max delay %v: departs %d", s.p.limit, time.Duration(s.p.window), time.Duration(s.p.maxDelay), s.dep)
	default:
		return fmt.Sprintf("concurrency %d: %d in flight (epoch %d)", s.p.limit, s.inflight, s.epoch)
	}
}

// convert carries the bucket over to the limits p at now (docs/rules.md,
// "Rule changes"): spend carries over as tokens, not as time.
func (s *refState) convert(p refParams, now int64, nextEpoch func() int) *refState {
	if s.p == p {
		return s
	}
	old := s.p
	if old.alg != p.alg {
		if old.alg == quota.AlgorithmConcurrency || p.alg == quota.AlgorithmConcurrency {
			return freshState(p, now, nextEpoch()) // starts over
		}
		// The whole tokens spent under the old rule (a token partly earned
		// back still counts) are charged to a fresh state of the new one,
		// never more than it lets spend.
		spent := ceilRat(s.spent(now))
		n := freshState(p, now, s.epoch)
		switch p.alg {
		case quota.AlgorithmGCRA:
			n.tokens = ratInt(p.burst - min(spent, p.burst))
		case quota.AlgorithmFixedWindow, quota.AlgorithmSlidingWindow:
			n.cur = min(spent, p.limit)
		case quota.AlgorithmSlidingLog:
			if c := min(spent, p.limit); c > 0 {
				n.log = []refEntry{{at: now, cost: c}}
			}
		case quota.AlgorithmLeakyBucket:
			// The queue holds at most maxDelay/T + 1 requests of cost 1:
			// what that many admissions from empty leave queued.
			n.dep = now + min(spent, p.maxDelay/p.interval()+1)*p.interval()
		}
		return n
	}
	n := s.clone()
	n.roll(now)
	n.p = p
	switch p.alg {
	case quota.AlgorithmGCRA:
		// x' = min(x + max(0, B'−B), B'); the stored time is rounded up to
		// the nanosecond: tat' = now + ⌈(B'−x')·T'⌉.
		x := s.gcraTokens(now)
		x.Add(x, ratInt(max(0, p.burst-old.burst)))
		if b := ratInt(p.burst); x.Cmp(b) > 0 {
			x = b
		}
		ns := ceilRat(new(big.Rat).Mul(new(big.Rat).Sub(ratInt(p.burst), x), ratInt(p.interval())))
		n.tokens, n.at = new(big.Rat).Sub(ratInt(p.burst), rat(ns, p.interval())), now
	case quota.AlgorithmFixedWindow:
		// The current window keeps its start and ends at start + the new
		// length; if that is already past, a fresh window.
		if p.window != old.window {
			n.end = n.start + p.window
			if n.end <= now {
				n = freshState(p, now, s.epoch)
			}
		}
	case quota.AlgorithmLeakyBucket:
		// A queue of q tokens under T is q tokens under T', rounded up,
		// clamped to the new max delay.
		if q := n.dep - now; q > 0 {
			w := new(big.Rat).Mul(rat(q, old.interval()), ratInt(p.interval()))
			n.dep = now + min(ceilRat(w), p.maxDelay)
		}
	}
	return n
}

// refPenalty is one identity's penalty box under a rule.
type refPenalty struct {
	winStart, count, level, until int64
}

// refPenaltyParams are a rule's penalty after defaults.
type refPenaltyParams struct{ after, within, base, max int64 }

func (b *refPenalty) locked(now int64) bool { return now < b.until }

// record counts one rejection: after `after` of them within `within` the
// identity is boxed for base, doubling on each repeat up to max; the
// doubling starts over once a box has been over for max.
func (b *refPenalty) record(p refPenaltyParams, now int64) {
	if b.locked(now) {
		return
	}
	if b.level > 0 && now >= b.until+p.max {
		b.level = 0
	}
	if b.count == 0 || now >= b.winStart+p.within {
		b.winStart, b.count = now, 0
	}
	b.count++
	if b.count >= p.after {
		lock := p.max
		if b.level < 62 && p.base <= p.max>>b.level {
			lock = min(p.base<<b.level, p.max)
		}
		b.until = now + lock
		b.level++
		b.count = 0
	}
}

// refRule is a rule as the reference reads it.
type refRule struct {
	r   quota.Rule
	inc int
}

// params returns the limits for identity id under tier: an override for
// the identity beats a tier of that name, which beats the rule; a field an
// override leaves out comes from the next level.
func (rr *refRule) params(id, tier string) refParams {
	r := &rr.r
	limit, burst := r.Limit, r.Burst
	if burst == 0 {
		burst = limit
	}
	for _, t := range r.Tiers {
		if tier != "" && t.Name == tier {
			limit = t.Limit
			if t.Burst != 0 {
				burst = t.Burst
			} else if r.Burst != 0 {
				burst = r.Burst
			} else {
				burst = r.Limit
			}
		}
	}
	for _, o := range r.Overrides {
		if o.Identity == id {
			if o.Limit != 0 {
				limit = o.Limit
			}
			if o.Burst != 0 {
				burst = o.Burst
			}
		}
	}
	alg := r.Algorithm
	if alg == "" || alg == quota.AlgorithmTokenBucket {
		alg = quota.AlgorithmGCRA
	}
	p := refParams{alg: alg, limit: limit, burst: burst, window: int64(r.Window)}
	switch alg {
	case quota.AlgorithmGCRA, quota.AlgorithmLeakyBucket:
	default:
		p.burst = limit
	}
	if alg == quota.AlgorithmLeakyBucket {
		// max_delay is the rule's when it sets one; its default,
		// (burst−1) × window ÷ limit, is the identity's: of its override
		// or tier when it has one.
		p.maxDelay = int64(r.MaxDelay)
		if p.maxDelay == 0 {
			p.maxDelay = new(big.Int).Div(new(big.Int).Mul(big.NewInt(burst-1), big.NewInt(int64(r.Window))), big.NewInt(limit)).Int64()
		}
	}
	return p
}

func (rr *refRule) penalty() (refPenaltyParams, bool) {
	pn := rr.r.Penalty
	if pn == nil {
		return refPenaltyParams{}, false
	}
	p := refPenaltyParams{after: pn.After, within: int64(pn.Within), base: int64(pn.Base), max: int64(pn.Max)}
	if p.within == 0 {
		p.within = int64(quota.DefaultPenaltyWithin)
	}
	if p.max == 0 {
		p.max = 32 * p.base
	}
	return p, true
}

// cost is what a request of method costs under the rule, unless the
// request names its own cost.
func (rr *refRule) cost(method string, reqCost int64) int64 {
	if reqCost > 0 {
		return reqCost
	}
	if c, ok := rr.r.CostByMethod[strings.ToUpper(method)]; ok {
		return c
	}
	if rr.r.Cost > 0 {
		return rr.r.Cost
	}
	return 1
}

// matches reports whether the rule applies to a request (docs/rules.md,
// "match"): exact path, prefix on segment boundaries, or a pattern of
// literal segments, {name} for one segment and a final * for the rest.
func (rr *refRule) matches(method, p string) bool {
	m := rr.r.Match
	if len(m.Methods) > 0 {
		ok := false
		for _, x := range m.Methods {
			ok = ok || strings.EqualFold(x, method)
		}
		if !ok {
			return false
		}
	}
	switch {
	case m.Path != "":
		return p == m.Path
	case m.Prefix != "":
		pre := strings.TrimSuffix(m.Prefix, "/")
		return pre == "" || p == pre || strings.HasPrefix(p, pre+"/")
	case m.Pattern != "":
		pat := strings.Split(strings.Trim(m.Pattern, "/"), "/")
		seg := strings.Split(strings.Trim(p, "/"), "/")
		if strings.Trim(p, "/") == "" {
			seg = nil
		}
		for i, ps := range pat {
			if ps == "*" && i == len(pat)-1 {
				return true
			}
			if i >= len(seg) {
				return false
			}
			if strings.HasPrefix(ps, "{") {
				if seg[i] == "" {
					return false
				}
				continue
			}
			if ps != seg[i] {
				return false
			}
		}
		return len(seg) == len(pat)
	}
	return true
}

// refRequest is one request as the reference sees it.
type refRequest struct {
	method, path string
	header       map[string]string // canonical name → value
	user, ip     string
	tier         string
	cost         int64
}

// identity walks the rule's key chain: the first source with a value is the
// identity, in that source's namespace; none, or global, is the "" bucket.
func (rr *refRule) identity(q *refRequest) (src, id string) {
	for _, k := range rr.r.Key {
		switch k.Kind {
		case quota.KeyHeader:
			if v := q.header[k.Name]; v != "" {
				return "header:" + k.Name, v
			}
		case quota.KeyUser:
			if q.user != "" {
				return "user", q.user
			}
		case quota.KeyIP:
			if q.ip != "" {
				return "ip", q.ip
			}
		case quota.KeyGlobal:
			return "", ""
		}
	}
	return "", ""
}

// cleanRefPath is the path the middleware matches rules against.
func cleanRefPath(p string) string {
	if p == "" {
		return "/"
	}
	c := path.Clean("/" + p)
	if c != "/" && strings.HasSuffix(p, "/") {
		c += "/"
	}
	return c
}

// refLimiter is the reference: the rules in force and every bucket.
//
// Under key-cap pressure a bucket may have been evicted by the Node at any
// instant: cands holds, per key, every state the bucket may be in under the
// documented policy (docs/overshoot.md, "The local key cap": an idle entry
// goes first, else the one of the entries examined that owes the least,
// and an evicted identity starts over, regaining at most what it had
// spent). What an entry owes is measured as its store measures it (time
// for gcra and leaky_bucket, whose store is shared by rules of different
// rates; tokens for the others). The entries around a model identity are
// the rotating identities of the pressure, so a bucket may be taken as
// evicted only while it owes at most the most any rotating identity owed
// in its store (floodDebt): a more indebted one is never the least
// indebted of a sample of them.
type refLimiter struct {
	rules []refRule
	incs  map[string]int // rule id → incarnations so far
	cands map[refKey][]*refState
	// tiers is the tier each bucket was last decided under, if the rule
	// named it then ("" otherwise): a tier the rule adds later applies to
	// a bucket from its next request under it (docs/rules.md).
	tiers     map[refKey]string
	boxes     map[refKey]*refPenalty
	epochs    int
	floodDebt map[string]*big.Rat // per store: the most a rotating identity owed
}

func newRefLimiter() *refLimiter {
	return &refLimiter{incs: map[string]int{}, cands: map[refKey][]*refState{},
		tiers: map[refKey]string{}, boxes: map[refKey]*refPenalty{}, floodDebt: map[string]*big.Rat{}}
}

func (l *refLimiter) nextEpoch() int { l.epochs++; return l.epochs }

func (l *refLimiter) rule(id string) *refRule {
	for i := range l.rules {
		if l.rules[i].r.ID == id {
			return &l.rules[i]
		}
	}
	return nil
}

// install puts rules in force at now. A rule whose id is new (or was
// removed before) is a new incarnation and starts empty; a kept rule's
// buckets are converted at now to the limits each identity is under in the
// new rule; a removed penalty drops its boxes.
func (l *refLimiter) install(rules []quota.Rule, now int64) {
	old := map[string]refRule{}
	for _, rr := range l.rules {
		old[rr.r.ID] = rr
	}
	l.rules = nil
	for _, r := range rules {
		rr := refRule{r: r}
		if o, ok := old[r.ID]; ok {
			rr.inc = o.inc
		} else {
			l.incs[r.ID]++
			rr.inc = l.incs[r.ID]
		}
		l.rules = append(l.rules, rr)
	}
	for k, cs := range l.cands {
		rr := l.rule(k.rule)
		if rr == nil || rr.inc != k.inc {
			delete(l.cands, k)
			delete(l.tiers, k)
			continue
		}
		p := rr.params(k.id, l.tiers[k])
		cs = l.mayBeEvicted(cs, now) // from the store it was in before the change
		for i, c := range cs {
			n := c.convert(p, now, l.nextEpoch)
			if n != c && n.written == nil {
				n.written = c
			}
			cs[i] = n
		}
		l.cands[k] = dedupe(cs, now)
	}
	for k := range l.boxes {
		rr := l.rule(k.rule)
		if _, ok := rr.penaltyOrNil(); rr == nil || rr.inc != k.inc || !ok {
			delete(l.boxes, k)
		}
	}
}

// namesTier reports whether the rule has a tier named tier.
func (rr *refRule) namesTier(tier string) bool {
	for _, t := range rr.r.Tiers {
		if tier != "" && t.Name == tier {
			return true
		}
	}
	return false
}

func (rr *refRule) penaltyOrNil() (refPenaltyParams, bool) {
	if rr == nil {
		return refPenaltyParams{}, false
	}
	return rr.penalty()
}

// refRuleOut is the reference's expectation for one rule of a request.
type refRuleOut struct {
	rule      string
	key       refKey
	shadow    bool
	locked    bool
	cost      int64
	verdicts  []refVerdict // one per candidate state
	allowedOK map[bool]bool
}

// nodeRule is what the Node said about one rule, as far as it is known.
type nodeRule struct {
	known     bool
	allowed   bool // the bucket (and penalty box) would admit
	locked    bool
	remaining int64
	delay     int64
	raw       string // the Node's result, for the failure message
}

// outcome is what the reference expects of one request before the Node's
// answer is known: per matching rule, the verdict of every candidate.
type outcome struct {
	rules []refRuleOut
	now   int64
}

// expect evaluates q at now without charging anything.
func (l *refLimiter) expect(q *refRequest, now int64) *outcome {
	out := &outcome{now: now}
	for i := range l.rules {
		rr := &l.rules[i]
		if !rr.matches(q.method, q.path) {
			continue
		}
		src, id := rr.identity(q)
		k := refKey{rule: rr.r.ID, inc: rr.inc, src: src, id: id}
		p := rr.params(id, q.tier)
		ro := refRuleOut{rule: rr.r.ID, key: k, shadow: rr.r.Shadow, cost: rr.cost(q.method, q.cost)}
		if b := l.boxes[k]; b != nil && b.locked(now) {
			ro.locked = true
		}
		cs := l.cands[k]
		switch {
		case ro.locked:
			// The penalty box answers before the bucket, which the request
			// does not touch: its variant does not change.
			if len(cs) == 0 {
				cs = []*refState{freshState(p, now, l.nextEpoch())}
				l.cands[k] = cs
			}
		default:
			if len(cs) == 0 {
				cs = []*refState{freshState(p, now, l.nextEpoch())}
			}
			cs = l.mayBeEvicted(cs, now) // before a change of variant converts it
			for j, c := range cs {
				cs[j] = c.convert(p, now, l.nextEpoch) // the identity's variant may have changed (tier)
				cs[j].written = nil                    // the decision writes it under the rules in force
			}
			l.cands[k] = dedupe(cs, now)
			cs = l.cands[k]
			l.tiers[k] = ""
			if rr.namesTier(q.tier) {
				l.tiers[k] = q.tier
			}
		}
		for _, c := range cs {
			v := c.clone().decide(now, ro.cost, true)
			v.uncharged = c.clone().decide(now, ro.cost, false).remaining
			if ro.locked {
				v.allowed = false
			}
			ro.verdicts = append(ro.verdicts, v)
		}
		out.rules = append(out.rules, ro)
	}
	return out
}

// mayBeEvicted adds a fresh bucket to a key's candidates when the Node may
// have evicted it since its last decision (see refLimiter): a candidate
// that owes, as its store measures it, at most what a rotating identity
// owed in that store. It is applied to the candidates as they were stored,
// before a rule change or a change of variant converts them.
func (l *refLimiter) mayBeEvicted(cs []*refState, now int64) []*refState {
	for _, c := range cs {
		w := c
		if c.written != nil {
			w = c.written // as the store holds it, under the limits it was written with
		}
		flood := l.floodDebt[storeOf(w.p.alg)]
		if flood == nil || w.debt(now).Cmp(flood) > 0 {
			continue
		}
		fresh := freshState(c.p, now, cs[0].epoch)
		for _, o := range cs {
			if o.equal(fresh, now) {
				return cs
			}
		}
		return append(cs, fresh)
	}
	return cs
}

// apply checks the Node's answer against the expectation and books it:
// every rule's verdict must be one of its candidates' (the others are
// dropped), the request is admitted iff every enforced rule admits, and then
// the enforced rules and the admitting shadow rules are charged; every
// enforced rule that rejects (and is not locked) counts a rejection in its
// penalty box. It returns a description of the first divergence, or "".
func (l *refLimiter) apply(out *outcome, allowed bool, node []nodeRule) string {
	now := out.now
	want := true
	for i := range out.rules {
		ro := &out.rules[i]
		nr := node[i]
		cs := l.cands[ro.key]
		var keep []*refState
		var keepV []refVerdict
		for j, v := range ro.verdicts {
			rem := v.uncharged
			if allowed && v.allowed && !ro.locked {
				rem = v.remaining
			}
			if !nr.known || (v.allowed == nr.allowed && ro.locked == nr.locked &&
				(rem < 0 || nr.remaining < 0 || ro.locked || rem == nr.remaining) &&
				(!v.allowed || nr.delay < 0 || v.delay == nr.delay)) {
				keep = append(keep, cs[j])
				keepV = append(keepV, v)
			}
		}
		if len(keep) == 0 {
			v := ro.verdicts[0]
			if !(allowed && v.allowed && !ro.locked) {
				v.remaining = v.uncharged
			}
			return fmt.Sprintf("rule %s, bucket %s: the Node says allowed=%v locked=%v remaining=%d delay=%v; the reference (%s) allowed=%v locked=%v remaining=%d delay=%v (the Node's result: %s)",
				ro.rule, ro.key, nr.allowed, nr.locked, nr.remaining, time.Duration(nr.delay),
				cs[0], v.allowed, ro.locked, v.remaining, time.Duration(v.delay), nr.raw)
		}
		l.cands[ro.key] = keep
		ro.verdicts = keepV
		if !ro.shadow {
			if nr.known {
				want = want && nr.allowed
			} else {
				all := true
				for _, v := range keepV {
					all = all && v.allowed
				}
				want = want && all
			}
		}
	}
	if want != allowed {
		return fmt.Sprintf("the Node's request verdict allowed=%v, but its rules' verdicts make %v", allowed, want)
	}
	for i := range out.rules {
		ro := &out.rules[i]
		cs := l.cands[ro.key]
		for j, c := range cs {
			charge := allowed && !ro.locked && ro.verdicts[j].allowed
			c.decide(now, ro.cost, charge)
		}
		if !ro.shadow && !ro.locked && !ro.verdicts[0].allowed {
			if pp, ok := l.rule(ro.rule).penalty(); ok {
				b := l.boxes[ro.key]
				if b == nil {
					b = &refPenalty{}
					l.boxes[ro.key] = b
				}
				b.record(pp, now)
			}
		}
		l.cands[ro.key] = dedupe(cs, now)
	}
	return ""
}

func dedupe(cs []*refState, now int64) []*refState {
	var out []*refState
	for _, c := range cs {
		dup := false
		for _, o := range out {
			dup = dup || o.equal(c, now)
		}
		if !dup {
			out = append(out, c)
		}
	}
	return out
}

// release gives back a concurrency admission of cost on key, charged in
// epoch: a bucket that started over since then is not touched.
func (l *refLimiter) release(k refKey, cost int64, epoch int) {
	for _, c := range l.cands[k] {
		if c.p.alg == quota.AlgorithmConcurrency && c.epoch == epoch {
			c.inflight = max(c.inflight-cost, 0)
		}
	}
}

// prune drops the buckets that equal fresh ones, to keep the reference small
// under rotating identities.
func (l *refLimiter) prune(now int64) {
	for k, cs := range l.cands {
		if len(cs) == 1 && cs[0].idle(now) && cs[0].p.alg != quota.AlgorithmConcurrency {
			delete(l.cands, k)
			delete(l.tiers, k)
		}
	}
}

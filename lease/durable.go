package lease

import (
	"cmp"
	"container/heap"
	"fmt"
	"maps"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/weir-dev/weir/bucket"
)

// This file is the durable-counter store: the GCRA buckets of `durable: true`
// rules ("one free trial per account", OTP attempts), a pure state machine
// beside the lease Machine and the RuleStore. Every decision is one entry of
// the group's Raft log, so it is linearizable, survives the crash of any
// node (a quorum holds it on disk), and a new leader continues from exactly
// the buckets the old one left: no free window.
//
// A DurableCommand carries the rule's parameters (limit, window, burst), so
// the store does not depend on where a node's rules come from. A bucket
// remembers the parameters it was written under (emission interval and
// burst), and the store remembers, per rule, the parameters of the newest
// command and when they first appeared (the store's clock at the first
// command that carried them). At a bucket's first decision under other
// parameters than its own it is converted with bucket.GCRA.Convert as of
// that instant: spend carries over as tokens, not as time (a raised limit
// or burst never rejects what a bucket of the new rule holding the same
// tokens would admit; a lowered one clamps the tokens to the new burst, and
// debt stays debt). So the result is the one converting every bucket of the
// rule when the change first reached the store would give, whichever
// identity is decided next; the conversion reads only the log, so every
// replica makes it alike. A bucket that saw no decision while its rule went
// through several parameter sets is converted once, from its own to the
// newest. Time is the
// proposing leader's clock, made monotone by the store (a command older than
// the newest one applied is decided at the newest time): a leader whose
// clock is behind its predecessor's decides as if no time had passed until
// it catches up (stricter), one whose clock is ahead refills early by at
// most the skew (for a rule of one per 30 days, half a second of skew is
// nothing).
//
// Retries are idempotent: a command carries a request id (raftgroup.Group and Client
// draw one per call, before they retry), and the store remembers the
// result of every id it applied within DurableRetryWindow of the store's
// clock, up to MaxDurableRequests of them (the oldest go first). A retry
// that arrives later than that (or after more than MaxDurableRequests other
// durable decisions) is charged again: raftgroup.Group.Durable and Client.Durable
// retry only within their ctx, bounded by ProposeTimeout (5s by default),
// far inside the window.
//
// A full bucket equals no entry and is dropped: on every Tick the store
// drops the buckets whose TAT has passed (a heap ordered by TAT finds them
// without a scan), so memory follows the live keys.

// Bounds of a durable command.
const (
	// DurableRetryWindow is how long (on the store's clock) the result of
	// a durable command is kept for a retry under the same request id.
	DurableRetryWindow = time.Minute
	// MaxDurableRequests is the most request ids the store remembers.
	MaxDurableRequests = 1 << 16
	// MaxDurableIdentityBytes is the longest identity a durable command
	// may carry.
	MaxDurableIdentityBytes = 4096
	// MaxDurableRuleIDBytes is the longest rule id a durable command may
	// carry (quota's rule ids are at most 128 bytes).
	MaxDurableRuleIDBytes = 128
)

// DurableRule is what a durable decision needs of its rule: the id that
// names its buckets and the GCRA parameters (Limit tokens per Window,
// capacity Burst). Every decision carries them, so a changed limit applies
// from the next decision on, to the same buckets.
type DurableRule struct {
	ID     string
	Limit  int64
	Window time.Duration
	Burst  int64
}

// DurableCommand is one decision of a durable rule, an entry of the
// replicated log.
type DurableCommand struct {
	// Now is the proposing leader's clock (unix ns). raftgroup.Group stamps it; a
	// caller's value is overwritten.
	Now int64
	// RequestID names the request across retries (at most
	// MaxRequestIDBytes; empty: none, every application charges).
	RequestID string
	// Rule is the rule's id and parameters.
	Rule DurableRule
	// Identity is the bucket's identity within the rule (any bytes, at
	// most MaxDurableIdentityBytes).
	Identity string
	// Cost is the tokens the request spends, at least 1.
	Cost int64
	// Legacy and KeyFormat name the bucket under the embedding node's key
	// formats (DurableKey, durable_legacy.go); zero for a format-1 command.
	Legacy    string
	KeyFormat uint32
}

// Check checks c's form (a rule id, the size limits, a cost of at least 1,
// the legacy identity's fields, parameters that make a GCRA), as
// DurableStore.Apply and the codec do; errors wrap ErrBadCommand. A
// proposer calls it to refuse a malformed command before a round trip.
func (c DurableCommand) Check() error {
	_, err := c.check()
	return err
}

// check is Check, returning c's GCRA.
func (c DurableCommand) check() (bucket.GCRA, error) {
	switch {
	case c.Rule.ID == "":
		return bucket.GCRA{}, fmt.Errorf("%w: a durable command needs a rule id", ErrBadCommand)
	case len(c.Rule.ID) > MaxDurableRuleIDBytes || !utf8.ValidString(c.Rule.ID):
		return bucket.GCRA{}, fmt.Errorf("%w: durable rule id of %d bytes: want valid UTF-8 of at most %d", ErrBadCommand, len(c.Rule.ID), MaxDurableRuleIDBytes)
	case len(c.Identity) > MaxDurableIdentityBytes:
		return bucket.GCRA{}, fmt.Errorf("%w: durable identity of %d bytes, over %d", ErrBadCommand, len(c.Identity), MaxDurableIdentityBytes)
	case len(c.RequestID) > MaxRequestIDBytes:
		return bucket.GCRA{}, fmt.Errorf("%w: request id of %d bytes, over %d", ErrBadCommand, len(c.RequestID), MaxRequestIDBytes)
	case c.Cost < 1:
		return bucket.GCRA{}, fmt.Errorf("%w: durable cost %d: must be at least 1", ErrBadCommand, c.Cost)
	}
	if err := c.checkLegacy(); err != nil {
		return bucket.GCRA{}, err
	}
	g, err := bucket.NewGCRA(c.Rule.Limit, c.Rule.Window, c.Rule.Burst)
	if err != nil {
		return bucket.GCRA{}, fmt.Errorf("%w: durable rule %q: %w", ErrBadCommand, c.Rule.ID, err)
	}
	return g, nil
}

// durableKey names one bucket.
type durableKey struct{ rule, identity string }

func compareDurableKeys(a, b durableKey) int {
	return cmp.Or(cmp.Compare(a.rule, b.rule), cmp.Compare(a.identity, b.identity))
}

// durableReq is a remembered request: its id, when it was applied (the
// store's clock) and its result.
type durableReq struct {
	id  string
	at  int64
	dec bucket.Decision
}

// durableParams are the GCRA parameters a bucket was written under: the
// emission interval (ns) and the burst. The zero value means unknown (a
// bucket restored from a state of version 3, which did not record them):
// such a bucket is taken to be in the parameters of its next decision.
type durableParams struct{ t, burst int64 }

// paramsOf returns g's parameters.
func paramsOf(g bucket.GCRA) durableParams {
	return durableParams{t: g.Interval().Nanoseconds(), burst: g.Burst()}
}

// gcra returns the GCRA of p (known parameters that a command built once).
func (p durableParams) gcra() (bucket.GCRA, error) {
	return bucket.NewGCRA(1, time.Duration(p.t), p.burst)
}

// valid reports whether p is unknown or builds a GCRA.
func (p durableParams) valid() bool {
	if p == (durableParams{}) {
		return true
	}
	_, err := p.gcra()
	return p.t >= 1 && err == nil
}

// durableBucket is one held bucket: its TAT and the parameters it is in.
type durableBucket struct {
	tat int64
	p   durableParams
}

// durableRuleState is what the store knows of one rule while it holds
// buckets of it: the parameters of the newest command, since when (the
// store's clock at the first command that carried them), and how many
// buckets it holds.
type durableRuleState struct {
	p     durableParams
	since int64
	n     int
}

// DurableStore holds the buckets of durable rules. The zero value is not
// usable: NewDurableStore returns an empty store. It is not safe for
// concurrent use; the FSM guards it.
type DurableStore struct {
	now   int64                        // the newest time applied
	tats  map[durableKey]durableBucket // only buckets that are not full (TAT > now)
	rules map[string]*durableRuleState // exactly the rules of the buckets in tats
	exp   expiryHeap                   // at least one entry per key of tats, by TAT (lazy: a key's TAT may have changed since)
	reqs  []durableReq                 // remembered requests, oldest first; reqs[head:] are live
	head  int
	byID  map[string]int // request id → index in reqs
	// The key-format switch (durable_legacy.go): set by the first command
	// of key format 2; legacy then holds the buckets as format-1 commands
	// left them, legacyExp their expiry (lazy, like exp).
	switched  bool
	legacy    map[durableKey]durableBucket
	legacyExp expiryHeap
}

// NewDurableStore returns an empty store.
func NewDurableStore() *DurableStore {
	return &DurableStore{tats: map[durableKey]durableBucket{}, rules: map[string]*durableRuleState{}, byID: map[string]int{}}
}

// Len is the number of buckets held (those not full).
func (s *DurableStore) Len() int { return len(s.tats) }

// empty reports whether the store is in its initial state.
func (s *DurableStore) empty() bool {
	return s.now == 0 && len(s.tats) == 0 && s.Requests() == 0 && !s.switched
}

// Requests is the number of request ids remembered.
func (s *DurableStore) Requests() int { return len(s.reqs) - s.head }

// TAT returns the bucket's theoretical arrival time (unix ns on the
// leaders' clocks); ok is false for a full bucket, which the store does
// not hold.
func (s *DurableStore) TAT(rule, identity string) (tat int64, ok bool) {
	b, ok := s.tats[durableKey{rule, identity}]
	return b.tat, ok
}

// Apply decides c at max(c.Now, the newest time applied) and returns the
// decision (bucket.GCRA.Step: an admission charges the bucket, a rejection
// changes nothing), after converting the bucket to c's parameters if it is
// in others (see the file comment). A command whose RequestID the store
// remembers is a retry: it changes nothing and returns the first
// application's decision.
// A malformed command is refused with an error wrapping ErrBadCommand and
// changes nothing.
func (s *DurableStore) Apply(c DurableCommand) (bucket.Decision, error) {
	g, err := c.check()
	if err != nil {
		return bucket.Decision{}, err
	}
	s.advance(c.Now)
	if c.RequestID != "" {
		if i, ok := s.byID[c.RequestID]; ok {
			return s.reqs[i].dec, nil
		}
	}
	p := paramsOf(g)
	rs := s.rules[c.Rule.ID]
	since := s.now // when the rule's parameters became p
	if rs != nil && rs.p == p {
		since = rs.since
	}
	k := durableKey{c.Rule.ID, c.Identity}
	b, held := s.tats[k]
	b, inherited := s.inherit(c, k, b, held)
	t := bucket.TAT(b.tat)
	converted := false
	if (held || inherited) && b.p != p && b.p != (durableParams{}) {
		old, err := b.p.gcra()
		if err != nil { // unreachable: restore and Apply keep only parameters that build
			return bucket.Decision{}, fmt.Errorf("lease: durable bucket %q/%q in parameters %+v: %w", c.Rule.ID, c.Identity, b.p, err)
		}
		t, converted = g.Convert(old, t, since), true
	}
	if rs == nil {
		rs = &durableRuleState{}
		s.rules[c.Rule.ID] = rs
	}
	rs.p, rs.since = p, since
	d := g.Step(&t, s.now, c.Cost)
	switch {
	case int64(t) > s.now:
		s.tats[k] = durableBucket{tat: int64(t), p: p}
		if !held {
			rs.n++
		}
		if !held || converted { // a conversion may have moved the TAT earlier
			heap.Push(&s.exp, expiry{tat: int64(t), key: k})
		}
	case held: // converted to a full bucket and not charged
		s.drop(k)
	}
	if rs.n == 0 {
		delete(s.rules, c.Rule.ID)
	}
	s.recordLegacy(c, k)
	if c.RequestID != "" {
		s.remember(durableReq{id: c.RequestID, at: s.now, dec: d})
	}
	return d, nil
}

// Tick advances the store's clock to now (never back) and drops the full
// buckets and the requests older than DurableRetryWindow.
func (s *DurableStore) Tick(now int64) { s.advance(now) }

// advance moves the clock to max(now, s.now) and drops what expired.
func (s *DurableStore) advance(now int64) {
	s.now = max(s.now, now)
	for len(s.exp) > 0 && s.exp[0].tat <= s.now {
		e := heap.Pop(&s.exp).(expiry)
		switch b, ok := s.tats[e.key]; {
		case !ok:
		case b.tat <= s.now:
			s.drop(e.key)
		case b.tat != e.tat: // charged since: wait for its new TAT
			heap.Push(&s.exp, expiry{tat: b.tat, key: e.key})
		}
	}
	s.expireLegacy()
	for s.head < len(s.reqs) && (s.reqs[s.head].at < s.now-int64(DurableRetryWindow) || len(s.reqs)-s.head > MaxDurableRequests) {
		s.dropOldest()
	}
}

// drop removes the bucket of k, and its rule's state with its last bucket.
func (s *DurableStore) drop(k durableKey) {
	delete(s.tats, k)
	if rs := s.rules[k.rule]; rs != nil {
		if rs.n--; rs.n <= 0 {
			delete(s.rules, k.rule)
		}
	}
}

// remember records a request, dropping the oldest beyond the cap.
func (s *DurableStore) remember(r durableReq) {
	s.byID[r.id] = len(s.reqs)
	s.reqs = append(s.reqs, r)
	for len(s.reqs)-s.head > MaxDurableRequests {
		s.dropOldest()
	}
}

// dropOldest forgets the oldest remembered request, compacting the queue
// once half of it is dead so that memory follows the live requests.
func (s *DurableStore) dropOldest() {
	delete(s.byID, s.reqs[s.head].id)
	s.reqs[s.head] = durableReq{}
	s.head++
	if s.head >= 1024 && s.head*2 >= len(s.reqs) {
		live := slices.Clone(s.reqs[s.head:])
		s.reqs, s.head = live, 0
		for i, r := range s.reqs {
			s.byID[r.id] = i
		}
	}
}

// sortedKeys returns the held buckets' keys in order.
func (s *DurableStore) sortedKeys() []durableKey {
	return slices.SortedFunc(maps.Keys(s.tats), compareDurableKeys)
}

// expiry is a key's entry in the expiry heap.
type expiry struct {
	tat int64
	key durableKey
}

// expiryHeap orders entries by TAT, then key (a total order, so that the
// heap's shape is the same on every replica that built it the same way).
type expiryHeap []expiry

func (h expiryHeap) Len() int { return len(h) }
func (h expiryHeap) Less(i, j int) bool {
	return cmp.Or(cmp.Compare(h[i].tat, h[j].tat), compareDurableKeys(h[i].key, h[j].key)) < 0
}
func (h expiryHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *expiryHeap) Push(x any)   { *h = append(*h, x.(expiry)) }
func (h *expiryHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// marshal appends the store's section of the state encoding (snapshot.go).
func (s *DurableStore) marshal(w *stateWriter) {
	w.int(s.now)
	ids := slices.Sorted(maps.Keys(s.rules))
	w.uint(uint64(len(ids)))
	for _, id := range ids {
		rs := s.rules[id]
		w.str(id)
		w.int(rs.p.t)
		w.int(rs.p.burst)
		w.int(rs.since)
	}
	keys := s.sortedKeys()
	w.uint(uint64(len(keys)))
	for _, k := range keys {
		b := s.tats[k]
		w.str(k.rule)
		w.str(k.identity)
		w.int(b.tat)
		w.int(b.p.t)
		w.int(b.p.burst)
	}
	w.uint(uint64(len(s.reqs) - s.head))
	for _, r := range s.reqs[s.head:] {
		w.str(r.id)
		w.int(r.at)
		allowed := uint64(0)
		if r.dec.Allowed {
			allowed = 1
		}
		w.uint(allowed)
		w.int(r.dec.Limit)
		w.int(r.dec.Remaining)
		w.int(int64(r.dec.Reset))
		w.int(int64(r.dec.RetryAfter))
	}
}

// durableStore reads and checks the store's section of a state of version
// v (3: no parameters, read as unknown; 4: the rules' and the buckets'
// parameters); on failure it records the error and returns an empty store.
func (r *stateReader) durableStore(v byte) *DurableStore {
	empty := NewDurableStore()
	s := NewDurableStore()
	s.now = r.int()
	if s.now < 0 && r.err == nil {
		r.fail(fmt.Sprintf("durable store time %d is negative", s.now))
		return empty
	}
	if v >= 4 {
		prev := ""
		for i := range r.count() {
			id := r.str()
			rs := &durableRuleState{p: durableParams{t: r.int(), burst: r.int()}, since: r.int()}
			if r.err != nil {
				return empty
			}
			var msg string
			switch {
			case i > 0 && id <= prev:
				msg = "out of order"
			case id == "" || len(id) > MaxDurableRuleIDBytes:
				msg = "bad rule id"
			case !rs.p.valid():
				msg = fmt.Sprintf("parameters %+v do not make a GCRA", rs.p)
			case rs.since < 0 || rs.since > s.now:
				msg = fmt.Sprintf("parameters since %d, outside [0, now %d]", rs.since, s.now)
			}
			if msg != "" {
				r.fail(fmt.Sprintf("durable rule %q: %s", id, msg))
				return empty
			}
			s.rules[id] = rs
			prev = id
		}
	}
	var prev *durableKey
	for range r.count() {
		k := durableKey{r.str(), r.str()}
		tat := r.int()
		var p durableParams
		if v >= 4 {
			p = durableParams{t: r.int(), burst: r.int()}
		}
		if r.err != nil {
			return empty
		}
		rs := s.rules[k.rule]
		if v < 4 && rs == nil { // parameters unknown until the rule's next command
			rs = &durableRuleState{since: s.now}
			s.rules[k.rule] = rs
		}
		switch {
		case prev != nil && compareDurableKeys(*prev, k) >= 0:
			r.fail(fmt.Sprintf("durable bucket %q/%q out of order", k.rule, k.identity))
			return empty
		case tat <= s.now:
			r.fail(fmt.Sprintf("durable bucket %q/%q is full (TAT %d, now %d): it should have been dropped", k.rule, k.identity, tat, s.now))
			return empty
		case k.rule == "" || len(k.rule) > MaxDurableRuleIDBytes || len(k.identity) > MaxDurableIdentityBytes:
			r.fail(fmt.Sprintf("durable bucket %q/%q: bad rule id or identity", k.rule, k.identity))
			return empty
		case rs == nil:
			r.fail(fmt.Sprintf("durable bucket %q/%q: its rule has no parameters", k.rule, k.identity))
			return empty
		case !p.valid():
			r.fail(fmt.Sprintf("durable bucket %q/%q: parameters %+v do not make a GCRA", k.rule, k.identity, p))
			return empty
		}
		s.tats[k] = durableBucket{tat: tat, p: p}
		rs.n++
		s.exp = append(s.exp, expiry{tat: tat, key: k})
		prev = &k
	}
	for id, rs := range s.rules {
		if rs.n == 0 {
			r.fail(fmt.Sprintf("durable rule %q holds no bucket: it should have been dropped", id))
			return empty
		}
	}
	heap.Init(&s.exp)
	n := r.count()
	if n > MaxDurableRequests {
		r.fail(fmt.Sprintf("%d durable requests, over %d", n, MaxDurableRequests))
		return empty
	}
	s.reqs = make([]durableReq, 0, min(n, 1024))
	for range n {
		q := durableReq{id: r.str(), at: r.int()}
		allowed := r.uint()
		q.dec = bucket.Decision{Allowed: allowed == 1, Limit: r.int(), Remaining: r.int(), Reset: time.Duration(r.int()),
			RetryAfter: time.Duration(r.int())}
		if r.err != nil {
			return empty
		}
		var msg string
		switch _, dup := s.byID[q.id]; {
		case q.id == "" || len(q.id) > MaxRequestIDBytes:
			msg = "bad id"
		case dup:
			msg = "appears twice"
		case allowed > 1:
			msg = "bad allowed flag"
		case q.at > s.now || q.at < s.now-int64(DurableRetryWindow):
			msg = fmt.Sprintf("applied at %d, outside the retry window before %d", q.at, s.now)
		case len(s.reqs) > 0 && q.at < s.reqs[len(s.reqs)-1].at:
			msg = "out of order"
		}
		if msg != "" {
			r.fail(fmt.Sprintf("durable request %q: %s", q.id, msg))
			return empty
		}
		s.byID[q.id] = len(s.reqs)
		s.reqs = append(s.reqs, q)
	}
	return s
}

package weir

import (
	"context"
	"fmt"
	"time"
)

// KeyCheck is one charge of Node.CheckKeys: Cost tokens of Rule for Key.
type KeyCheck struct {
	// Rule is the rule's id.
	Rule string
	// Key is the identity the tokens are counted under.
	Key string
	// Cost is the tokens to charge; zero looks without charging (the
	// result tells whether one more token would pass). Negative is an error.
	Cost int64
}

// CheckKeys charges several (rule, key, cost) at once and returns one
// Decision over them, the way a rate-limit service answers a request with
// several descriptors (Envoy's RateLimitService): each check is charged on
// its own, whether or not another one is over its limit, as
// envoyproxy/ratelimit counts every descriptor. The Decision's Results are
// in the order of checks; Allowed is false when some enforced rule
// rejected; Degraded and weir_fail_open_total mark checks decided by
// on_failure because an owner or the lease group could not be reached,
// each bounded by ctx and the node's decide timeout. Nothing is charged
// when a rule id is unknown (ErrUnknownRule), a key is longer than
// Config.MaxIdentityBytes (ErrIdentityTooLong) or a cost is negative.
// A cost-0 look at a count_rejected rule decided by the cluster asks the
// identity's owner, as a charge does. Concurrency rules' slots are released
// at once, as in Check.
func (n *Node) CheckKeys(ctx context.Context, checks []KeyCheck) (Decision, error) {
	e := n.eng.load()
	var pbuf [inlineResults]pending
	ps := pbuf[:0]
	format := n.keyFormat.Load()
	for i, kc := range checks {
		ri, ok := e.set.Lookup(kc.Rule)
		if !ok {
			return Decision{}, fmt.Errorf("%w: %q (rule set version %d)", ErrUnknownRule, kc.Rule, e.set.Version())
		}
		if len(kc.Key) > n.maxID {
			return Decision{}, fmt.Errorf("%w: rule %s: %d bytes, the cap is %d", ErrIdentityTooLong, kc.Rule, len(kc.Key), n.maxID)
		}
		if kc.Cost < 0 {
			return Decision{}, fmt.Errorf("weir: CheckKeys: checks[%d].Cost: must not be negative, got %d", i, kc.Cost)
		}
		c := &e.rules[ri]
		ps = append(ps, n.pendingFor(i, c, kc.Key, 0, "", format, kc.Cost))
	}
	now := n.now()
	d := Decision{Allowed: true, limiting: -1, now: now, At: time.Unix(0, now)}
	for i := range ps {
		p := &ps[i]
		if p.cost == 0 && !(p.c.r.CountRejected && p.remote()) {
			n.reportUncharged(&d, p, now)
			continue
		}
		// A look at a count_rejected rule decided by the cluster asks the
		// identity's owner with cost 0 (a step that charges nothing): its
		// count may be past the limit, which this node cannot see.
		n.record(ctx, &d, p, now)
	}
	d.finish()
	for i := range d.Results() {
		r := &d.Results()[i]
		if r.charged && r.Allowed && !r.ShadowRejected {
			if r.release != nil {
				r.release.release(r.key, now, r.Cost)
			}
			r.slot.release()
			r.charged = false
		}
	}
	return d, nil
}

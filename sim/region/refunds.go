package region

import (
	"time"

	"github.com/weir-dev/weir/cluster"
)

// This file follows the refunds a node asks of a remote owner in a
// multi-rule run (Coordinator.Refund returns the range it asked for): the
// charge is held, neither stood nor refunded, until the owner gives the
// range back (CoordinatorConfig.OnRefund: refunded then) or the ask can no
// longer be given back (askLife after it: the node gives up an ask the
// owner has not acknowledged within a decide timeout, and what it sent
// before arrives within two call timeouts; the charge stood).

// askKey names the refunds one node asks for one identity under one rule.
type askKey struct {
	node, rule, identity string
}

// askedRefund is one refund asked of a remote owner: rule k's charge of a
// request for the rule's identity id, and the range the node asked for.
type askedRefund struct {
	k        int
	id       int32
	ch       charge
	cost     int64
	gen      uint64
	from, to int64
	deadline int64 // virtual time: the owner cannot give it back after this
	done     bool
}

// askLife is how long after a refund is asked the owner may still give it
// back (the module's comment).
func (c *Config) askLife() int64 {
	return int64(c.DecideTimeout+max(c.Sync/4, c.Tick)+c.Tick+2*c.CallTimeout+c.Linger) + int64(time.Millisecond)
}

// asked holds the refund that rule k's charge ch of request r asked of its
// owner (range rng) until the owner gives it back or its deadline passes.
func (rg *Region) asked(k int, r *ruleReq, ch *charge, rng cluster.RefundRange) {
	rr := rg.rules[k]
	a := &askedRefund{k: k, id: rr.identity(r.ident), ch: *ch, cost: r.cost, gen: rng.Gen, from: rng.From, to: rng.To,
		deadline: rg.sim.Now() + rg.cfg.askLife()}
	key := askKey{rng.Node, rng.Rule, rng.Identity}
	if rg.askedBy == nil {
		rg.askedBy = map[askKey][]*askedRefund{}
	}
	rg.askedBy[key] = append(rg.askedBy[key], a)
	rg.asks = append(rg.asks, a) // in deadline order: every ask lives askLife
}

// refundGiven is an owner's OnRefund: the asks of its range are refunded.
func (rg *Region) refundGiven(g cluster.RefundRange) {
	key := askKey{g.Node, g.Rule, g.Identity}
	list := rg.askedBy[key]
	keep := list[:0]
	vnow := rg.sim.Now()
	for _, a := range list {
		if a.done {
			continue
		}
		if a.gen == g.Gen && a.from >= g.From && a.to <= g.To {
			rr := rg.rules[a.k]
			if vnow > a.deadline {
				rr.lateRefunds += a.cost // counted as stood already
			}
			a.done = true
			rr.refunded += a.cost
			rr.maxLag = max(rr.maxLag, vnow-a.ch.at)
			rr.noteRefund(a.id, a.ch.at, vnow, a.cost, vnow-rg.t0-rg.horizon)
			continue
		}
		keep = append(keep, a)
	}
	if len(keep) == 0 {
		delete(rg.askedBy, key)
	} else {
		rg.askedBy[key] = keep
	}
}

// settleAsks counts as stood the asks whose deadline is before upTo
// (virtual time), or every ask when all is true (the end of the run).
func (rg *Region) settleAsks(upTo int64, all bool) {
	i := 0
	for ; i < len(rg.asks); i++ {
		a := rg.asks[i]
		if !all && a.deadline > upTo {
			break
		}
		if a.done {
			continue
		}
		a.done = true
		rr := rg.rules[a.k]
		rr.kept += a.cost
		rr.stand(rg, a.id, a.cost, &a.ch)
	}
	rg.asks = rg.asks[i:]
	if all {
		rg.asks, rg.askedBy = nil, nil
	}
}

// stand counts rule rr's charge ch of cost for its identity id as an
// admission that stood, for its checks.
func (rr *ruleRun) stand(rg *Region, id int32, cost int64, ch *charge) {
	rr.stood += cost
	rr.bySource[ch.src] += cost
	if ch.degraded {
		rr.degStood += cost
	}
	rr.chk.record(ch.at-rg.t0, int(id), cost, ch.degraded, ch.sketch)
}

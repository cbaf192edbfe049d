package cluster

import "slices"

// heldHandoff is a handed state of a rule this node does not know yet, and
// when it arrived.
type heldHandoff struct {
	at int64
	h  HandoffItem
}

// hold keeps h, a handed state of a rule this node does not know, as it
// arrived at now, until SetRules brings the rule: a node that joins owns its
// share of the identities as soon as its ring holds the others, which can be
// before its rules are loaded, and the states handed to it then must not be
// lost (it would decide the identities on fresh windows). At most MaxKeys
// states are held per rule, as many as the node would own of it; one past
// that is dropped and counted (Stats.HandoffsDropped).
func (c *Coordinator) hold(now int64, h *HandoffItem) {
	if c.heldN == nil {
		c.heldN = map[string]int{}
	}
	if c.heldN[h.Rule] >= c.cfg.MaxKeys {
		c.stats.HandoffsDropped++
		return
	}
	c.heldN[h.Rule]++
	it := *h
	it.Log = slices.Clone(h.Log) // the message's arrays are recycled
	c.held = append(c.held, heldHandoff{at: now, h: it})
}

// heldUntil returns when the state h handed at `at` is empty at the latest:
// what it counts lasts its debt, and a sliding window's count weighs on one
// window more.
func heldUntil(at int64, h *HandoffItem) int64 { return at + max(h.Debt, 0) + max(h.Window, 0) }

// takeHeld takes, in the order they arrived, the held states whose rule the
// coordinator now knows, each at the time it arrived (the rule was unknown
// since, so nothing decided on the identity in between), and hands on those
// whose identity is no longer this node's; it forgets those already empty.
func (c *Coordinator) takeHeld(now int64) {
	if len(c.held) == 0 {
		return
	}
	now = c.clock(now)
	kept := c.held[:0]
	for _, x := range c.held {
		switch {
		case heldUntil(x.at, &x.h) <= now:
			c.heldN[x.h.Rule]--
		case c.rules[x.h.Rule] == nil:
			kept = append(kept, x)
		default:
			c.heldN[x.h.Rule]--
			c.takeHandoffs(x.at, []HandoffItem{x.h})
			c.handOnStray(now, entryKey{x.h.Rule, x.h.Identity})
		}
	}
	clear(c.held[len(kept):])
	c.held = kept
	for rule, n := range c.heldN { // any order: each rule on its own
		if n <= 0 {
			delete(c.heldN, rule)
		}
	}
}

// handOnStray hands the state of k on to its owner when the ring in force
// gives k to another node (the ring changed while the state was held).
func (c *Coordinator) handOnStray(now int64, k entryKey) {
	if c.table == nil {
		return
	}
	o := c.table.OwnerName(k.identity)
	oe := c.owned.get(k)
	if o == "" || o == c.cfg.Self || oe == nil || oe.handed {
		return
	}
	c.handOff(now, o, oe)
	oe.handed = true
	oe.warming = false
}

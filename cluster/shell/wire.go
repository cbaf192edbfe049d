package shell

import (
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/cluster"
	"github.com/weir-dev/weir/cluster/peerpb"
	"github.com/weir-dev/weir/quota"
)

// This file converts a Message to the peer protocol's Batch and back. The
// decoder is the trust boundary of the peer transport: a batch from the
// network is checked field by field before the coordinator sees it, and a
// malformed one is rejected whole with an error that names the item and the
// field (the server answers codes.InvalidArgument and counts it).

// ErrMalformed is wrapped by every error decodeBatch returns.
var ErrMalformed = errors.New("cluster: malformed peer batch")

// encodeBatch converts m, sent by the node named from, to its wire form. It
// does not validate: the sender's own coordinator is trusted, the receiver
// checks.
func encodeBatch(from string, m *cluster.Message) *peerpb.Batch {
	b := &peerpb.Batch{From: from, Epoch: m.Epoch, HandedOver: m.HandedOver}
	if len(m.Syncs) > 0 {
		b.Syncs = make([]*peerpb.SyncItem, len(m.Syncs))
		items := make([]peerpb.SyncItem, len(m.Syncs)) // one allocation for all items
		for i, s := range m.Syncs {
			it := &items[i]
			it.Rule, it.Identity, it.Gen, it.Total, it.GrantEpoch, it.Grant = s.Rule, []byte(s.Identity), s.Gen, s.Total, s.GrantEpoch, s.Grant
			it.Refunded, it.RefundBase, it.Rejected = s.Refunded, s.RefundBase, s.Rejected
			b.Syncs[i] = it
		}
	}
	if len(m.Decides) > 0 {
		b.Decides = make([]*peerpb.DecideItem, len(m.Decides))
		items := make([]peerpb.DecideItem, len(m.Decides))
		for i, d := range m.Decides {
			it := &items[i]
			it.Ticket, it.Rule, it.Identity, it.Cost, it.Release = d.Ticket, d.Rule, []byte(d.Identity), d.Cost, d.Release
			b.Decides[i] = it
		}
	}
	if len(m.Acks) > 0 {
		b.Acks = make([]*peerpb.AckItem, len(m.Acks))
		items := make([]peerpb.AckItem, len(m.Acks))
		for i, a := range m.Acks {
			it := &items[i]
			it.Rule, it.Identity, it.Gen, it.Total, it.Debt, it.GrantEpoch, it.Grant = a.Rule, []byte(a.Identity), a.Gen, a.Total, a.Debt, a.GrantEpoch, a.Grant
			it.Refunded = a.Refunded
			b.Acks[i] = it
		}
	}
	if len(m.Results) > 0 {
		b.Results = make([]*peerpb.ResultItem, len(m.Results))
		items := make([]peerpb.ResultItem, len(m.Results))
		for i, r := range m.Results {
			it := &items[i]
			it.Ticket, it.Allowed, it.Remaining, it.ResetAfter, it.RetryAfter, it.Debt, it.Delay = r.Ticket, r.Allowed, r.Remaining, r.Reset, r.RetryAfter, r.Debt, r.Delay
			b.Results[i] = it
		}
	}
	if len(m.Handoffs) > 0 {
		b.Handoffs = make([]*peerpb.HandoffItem, len(m.Handoffs))
		items := make([]peerpb.HandoffItem, len(m.Handoffs))
		for i, h := range m.Handoffs {
			it := &items[i]
			it.Rule, it.Identity, it.Debt, it.Count = h.Rule, []byte(h.Identity), h.Debt, h.Count
			it.Algorithm, it.Limit, it.Window, it.Burst, it.MaxDelay = string(h.Algorithm), h.Limit, h.Window, h.Burst, h.MaxDelay
			it.Prev, it.Span = h.Prev, h.Span
			if len(h.Log) > 0 {
				it.LogAges, it.LogCosts = make([]int64, len(h.Log)), make([]int64, len(h.Log))
				for j, e := range h.Log {
					it.LogAges[j], it.LogCosts[j] = e.Age, e.Cost
				}
			}
			if len(h.Slots) > 0 {
				it.Slots = make([]*peerpb.SlotItem, len(h.Slots))
				for j, s := range h.Slots {
					it.Slots[j] = &peerpb.SlotItem{Holder: s.Holder, Ticket: s.Ticket, Cost: s.Cost, Left: s.Left}
				}
			}
			b.Handoffs[i] = it
		}
	}
	if len(m.Blinds) > 0 {
		b.Blinds = encodeBlinds(m.Blinds)
	}
	if len(m.BlindAcks) > 0 {
		b.BlindAcks = make([]*peerpb.BlindAck, len(m.BlindAcks))
		items := make([]peerpb.BlindAck, len(m.BlindAcks))
		for i, a := range m.BlindAcks {
			it := &items[i]
			it.Stream, it.Seq = a.Stream, a.Seq
			b.BlindAcks[i] = it
		}
	}
	if len(m.Tracks) > 0 {
		b.Tracks = make([]*peerpb.TrackItem, len(m.Tracks))
		items := make([]peerpb.TrackItem, len(m.Tracks))
		for i, t := range m.Tracks {
			it := &items[i]
			it.Rule, it.Identity, it.Debt = t.Rule, []byte(t.Identity), t.Debt
			b.Tracks[i] = it
		}
	}
	return b
}

// encodeBlinds groups blind items into their reports (the items of one
// report, one stream and sequence number, sit next to each other), each
// in columns: its rule ids once, and per item an index into them, the
// identity's length (its bytes appended to the report's identities) and
// the cost. The columns of every report are windows on one array per
// column.
func encodeBlinds(blinds []cluster.BlindItem) []*peerpb.BlindReport {
	var reports []*peerpb.BlindReport
	index := make([]uint32, len(blinds))
	lengths := make([]uint32, len(blinds))
	costs := make([]int64, len(blinds))
	size := 0
	for i := range blinds {
		size += len(blinds[i].Identity)
	}
	ids := make([]byte, 0, size)
	for i := 0; i < len(blinds); {
		r := &peerpb.BlindReport{Stream: blinds[i].Stream, Seq: blinds[i].Seq}
		start := len(ids)
		j := i
		for ; j < len(blinds) && blinds[j].Stream == r.Stream && blinds[j].Seq == r.Seq; j++ {
			e := &blinds[j]
			k := len(r.Rules) - 1 // a report's items are mostly of one rule: the latest first
			for k >= 0 && r.Rules[k] != e.Rule {
				k--
			}
			if k < 0 {
				k = len(r.Rules)
				r.Rules = append(r.Rules, e.Rule)
			}
			index[j], lengths[j], costs[j] = uint32(k), uint32(len(e.Identity)), e.Cost
			ids = append(ids, e.Identity...)
		}
		r.RuleIndex, r.IdentityLengths, r.Costs = index[i:j:j], lengths[i:j:j], costs[i:j:j]
		r.Identities = ids[start:len(ids):len(ids)]
		reports = append(reports, r)
		i = j
	}
	return reports
}

// decodeBatch converts and validates a batch from the network. It rejects,
// with an error wrapping ErrMalformed that names the first problem:
//   - a nil batch or a nil item;
//   - more than MaxBatchItems items in all;
//   - an empty or over-long sender name (MaxNodeNameBytes) or rule id
//     (MaxRuleIDBytes), or one that is not valid UTF-8;
//   - an identity over MaxIdentityBytes (identities are any bytes, and may
//     be empty: a global rule's);
//   - a negative Total, Cost, Remaining, Reset, RetryAfter, Delay, Grant,
//     Refunded, Rejected, Count, or handoff Limit, Window, Burst or MaxDelay;
//   - a sync's RefundBase negative or above its Refunded;
//   - a zero Ticket (tickets start at 1);
//   - a blind report or acknowledgement whose stream or sequence number
//     is 0, or a blind report of no items, whose columns (rule indexes,
//     identity lengths, costs) differ in length, whose identities' lengths
//     do not add up to its identities' bytes, with more rule ids than
//     items, or an item whose rule index is not one of its rule ids.
//
// Debt may be any value: it is ≤ 0 when the owner's bucket is full. A
// decoded message never aliases b.
func decodeBatch(b *peerpb.Batch) (from string, m *cluster.Message, err error) {
	if b == nil {
		return "", nil, fmt.Errorf("%w: nil batch", ErrMalformed)
	}
	if p := checkName("from", b.From, cluster.MaxNodeNameBytes); p != "" {
		return "", nil, fmt.Errorf("%w: %s", ErrMalformed, p)
	}
	n := len(b.Syncs) + len(b.Decides) + len(b.Acks) + len(b.Results) + len(b.Handoffs) + len(b.BlindAcks) + len(b.Tracks)
	blinds := 0
	for _, r := range b.Blinds {
		if r != nil {
			blinds += len(r.IdentityLengths)
		}
	}
	if n += blinds; n > cluster.MaxBatchItems {
		return "", nil, fmt.Errorf("%w: %d items, more than %d", ErrMalformed, n, cluster.MaxBatchItems)
	}
	m = &cluster.Message{Epoch: b.Epoch, HandedOver: b.HandedOver}
	if len(b.Syncs) > 0 {
		if m.Syncs, err = decodeSyncs(b.Syncs); err != nil {
			return "", nil, err
		}
	}
	if len(b.Decides) > 0 {
		m.Decides = make([]cluster.DecideItem, len(b.Decides))
		for i, d := range b.Decides {
			if d == nil {
				return "", nil, itemErr("decides", i, "nil item")
			}
			if d.Ticket == 0 {
				return "", nil, itemErr("decides", i, "zero ticket")
			}
			if err := checkKey("decides", i, d.Rule, string(d.Identity)); err != nil {
				return "", nil, err
			}
			if d.Cost < 0 {
				return "", nil, itemErr("decides", i, fmt.Sprintf("negative cost %d", d.Cost))
			}
			m.Decides[i] = cluster.DecideItem{Ticket: d.Ticket, Rule: d.Rule, Identity: string(d.Identity), Cost: d.Cost, Release: d.Release}
		}
	}
	if len(b.Acks) > 0 {
		m.Acks = make([]cluster.AckItem, len(b.Acks))
		for i, a := range b.Acks {
			if a == nil {
				return "", nil, itemErr("acks", i, "nil item")
			}
			if err := checkKey("acks", i, a.Rule, string(a.Identity)); err != nil {
				return "", nil, err
			}
			if a.Total < 0 {
				return "", nil, itemErr("acks", i, fmt.Sprintf("negative total %d", a.Total))
			}
			if a.Grant < 0 {
				return "", nil, itemErr("acks", i, fmt.Sprintf("negative grant %d", a.Grant))
			}
			if a.Refunded < 0 {
				return "", nil, itemErr("acks", i, fmt.Sprintf("negative refunded %d", a.Refunded))
			}
			m.Acks[i] = cluster.AckItem{Rule: a.Rule, Identity: string(a.Identity), Gen: a.Gen, Total: a.Total, Debt: a.Debt,
				GrantEpoch: a.GrantEpoch, Grant: a.Grant, Refunded: a.Refunded}
		}
	}
	if len(b.Results) > 0 {
		if m.Results, err = decodeResults(b.Results); err != nil {
			return "", nil, err
		}
	}
	if len(b.Handoffs) > 0 {
		m.Handoffs = make([]cluster.HandoffItem, len(b.Handoffs))
		for i, h := range b.Handoffs {
			if h == nil {
				return "", nil, itemErr("handoffs", i, "nil item")
			}
			if err := checkKey("handoffs", i, h.Rule, string(h.Identity)); err != nil {
				return "", nil, err
			}
			if h.Count < 0 {
				return "", nil, itemErr("handoffs", i, fmt.Sprintf("negative count %d", h.Count))
			}
			for _, f := range []struct {
				name string
				v    int64
			}{{"limit", h.Limit}, {"window", h.Window}, {"burst", h.Burst}, {"max_delay", h.MaxDelay}, {"prev", h.Prev}, {"span", h.Span}} {
				if f.v < 0 {
					return "", nil, itemErr("handoffs", i, fmt.Sprintf("negative %s %d", f.name, f.v))
				}
			}
			log, err := decodeLog(i, h.LogAges, h.LogCosts)
			if err != nil {
				return "", nil, err
			}
			slots, err := decodeSlots(i, h.Slots)
			if err != nil {
				return "", nil, err
			}
			m.Handoffs[i] = cluster.HandoffItem{Rule: h.Rule, Identity: string(h.Identity), Debt: h.Debt, Count: h.Count,
				Prev: h.Prev, Span: h.Span, Log: log, Slots: slots,
				Algorithm: quota.Algorithm(h.Algorithm), Limit: h.Limit, Window: h.Window, Burst: h.Burst, MaxDelay: h.MaxDelay}
		}
	}
	if len(b.Blinds) > 0 {
		if m.Blinds, err = decodeBlinds(b.Blinds, blinds); err != nil {
			return "", nil, err
		}
	}
	if err := decodeBlindReplies(b, m); err != nil {
		return "", nil, err
	}
	return b.From, m, nil
}

// decodeBlindReplies converts and validates a batch's blind
// acknowledgements (a stream and a sequence number of at least 1 each)
// and tracks (a valid rule and identity) into m.
func decodeBlindReplies(b *peerpb.Batch, m *cluster.Message) error {
	if len(b.BlindAcks) > 0 {
		m.BlindAcks = make([]cluster.BlindAck, len(b.BlindAcks))
		for i, a := range b.BlindAcks {
			switch {
			case a == nil:
				return itemErr("blind_acks", i, "nil item")
			case a.Stream == 0 || a.Seq == 0:
				return itemErr("blind_acks", i, fmt.Sprintf("stream %d, seq %d (want both >= 1)", a.Stream, a.Seq))
			}
			m.BlindAcks[i] = cluster.BlindAck{Stream: a.Stream, Seq: a.Seq}
		}
	}
	if len(b.Tracks) > 0 {
		m.Tracks = make([]cluster.TrackItem, len(b.Tracks))
		for i, t := range b.Tracks {
			if t == nil {
				return itemErr("tracks", i, "nil item")
			}
			if err := checkKey("tracks", i, t.Rule, string(t.Identity)); err != nil {
				return err
			}
			m.Tracks[i] = cluster.TrackItem{Rule: t.Rule, Identity: string(t.Identity), Debt: t.Debt}
		}
	}
	return nil
}

// decodeBlinds converts and validates a batch's blind reports, of n items
// in all, into blind items (blindColumns says what a report must be). The
// items of a rule share its id's string, and a report's identities are
// substrings of one string: the coordinator copies an identity it keeps
// (a bucket made for it), so a report's string lives no longer than the
// step that charges it.
func decodeBlinds(in []*peerpb.BlindReport, n int) ([]cluster.BlindItem, error) {
	out := make([]cluster.BlindItem, 0, n)
	for i, r := range in {
		if err := blindColumns(i, r); err != nil {
			return nil, err
		}
		ids := string(r.Identities)
		for j, l := range r.IdentityLengths {
			switch x, c := r.RuleIndex[j], r.Costs[j]; {
			case int64(x) >= int64(len(r.Rules)):
				return nil, itemErr("blinds", i, fmt.Sprintf("item %d: rule index %d of %d rules", j, x, len(r.Rules)))
			case l > cluster.MaxIdentityBytes:
				return nil, itemErr("blinds", i, fmt.Sprintf("item %d: identity of %d bytes, more than %d", j, l, cluster.MaxIdentityBytes))
			case c < 0:
				return nil, itemErr("blinds", i, fmt.Sprintf("item %d: negative cost %d", j, c))
			}
			out = append(out, cluster.BlindItem{Stream: r.Stream, Seq: r.Seq, Rule: r.Rules[r.RuleIndex[j]], Identity: ids[:l], Cost: r.Costs[j]})
			ids = ids[l:]
		}
	}
	return out, nil
}

// blindColumns checks blind report i apart from its items' values: a
// stream and a sequence number of at least 1, at least one item, columns
// of one length, identities' lengths that add up to its identities'
// bytes, and valid rule ids, at most one per item.
func blindColumns(i int, r *peerpb.BlindReport) error {
	switch {
	case r == nil:
		return itemErr("blinds", i, "nil report")
	case r.Stream == 0 || r.Seq == 0:
		return itemErr("blinds", i, fmt.Sprintf("stream %d, seq %d (want both >= 1)", r.Stream, r.Seq))
	case len(r.IdentityLengths) == 0:
		return itemErr("blinds", i, "a report of no items")
	case len(r.RuleIndex) != len(r.IdentityLengths) || len(r.Costs) != len(r.IdentityLengths):
		return itemErr("blinds", i, fmt.Sprintf("%d rule indexes, %d identity lengths and %d costs (want one length)", len(r.RuleIndex), len(r.IdentityLengths), len(r.Costs)))
	case len(r.Rules) > len(r.IdentityLengths):
		return itemErr("blinds", i, fmt.Sprintf("%d rules for %d items", len(r.Rules), len(r.IdentityLengths)))
	}
	var size int64
	for _, l := range r.IdentityLengths {
		size += int64(l)
	}
	if size != int64(len(r.Identities)) {
		return itemErr("blinds", i, fmt.Sprintf("identity lengths add up to %d bytes, identities are %d", size, len(r.Identities)))
	}
	for k, rule := range r.Rules {
		if p := checkName("rule", rule, cluster.MaxRuleIDBytes); p != "" {
			return itemErr("blinds", i, fmt.Sprintf("rule %d: %s", k, p))
		}
	}
	return nil
}

// decodeResults converts and validates a batch's results (decodeBatch's
// rules).
func decodeResults(in []*peerpb.ResultItem) ([]cluster.ResultItem, error) {
	out := make([]cluster.ResultItem, len(in))
	for i, r := range in {
		if r == nil {
			return nil, itemErr("results", i, "nil item")
		}
		switch {
		case r.Ticket == 0:
			return nil, itemErr("results", i, "zero ticket")
		case r.Remaining < 0:
			return nil, itemErr("results", i, fmt.Sprintf("negative remaining %d", r.Remaining))
		case r.ResetAfter < 0:
			return nil, itemErr("results", i, fmt.Sprintf("negative reset_after %d", r.ResetAfter))
		case r.RetryAfter < 0:
			return nil, itemErr("results", i, fmt.Sprintf("negative retry_after %d", r.RetryAfter))
		case r.Delay < 0:
			return nil, itemErr("results", i, fmt.Sprintf("negative delay %d", r.Delay))
		}
		out[i] = cluster.ResultItem{Ticket: r.Ticket, Allowed: r.Allowed, Remaining: r.Remaining,
			Reset: r.ResetAfter, RetryAfter: r.RetryAfter, Debt: r.Debt, Delay: r.Delay}
	}
	return out, nil
}

// decodeSlots checks and converts handoff i's concurrency slots: at most
// bucket.MaxSlidingLogLimit of them (a state holds at most one per slot of
// its limit), each with a holder that is empty or a valid member name, a
// cost >= 1 and a time left >= 1 ns.
func decodeSlots(i int, in []*peerpb.SlotItem) ([]cluster.SlotItem, error) {
	switch {
	case len(in) > bucket.MaxSlidingLogLimit:
		return nil, itemErr("handoffs", i, fmt.Sprintf("%d slots, more than %d", len(in), bucket.MaxSlidingLogLimit))
	case len(in) == 0:
		return nil, nil
	}
	out := make([]cluster.SlotItem, len(in))
	for j, s := range in {
		switch {
		case s == nil:
			return nil, itemErr("handoffs", i, fmt.Sprintf("slot %d: nil", j))
		case s.Cost < 1 || s.Left < 1:
			return nil, itemErr("handoffs", i, fmt.Sprintf("slot %d: cost %d, left %d (want cost >= 1, left >= 1)", j, s.Cost, s.Left))
		}
		if s.Holder != "" {
			if p := checkName("holder", s.Holder, cluster.MaxNodeNameBytes); p != "" {
				return nil, itemErr("handoffs", i, fmt.Sprintf("slot %d: %s", j, p))
			}
		}
		out[j] = cluster.SlotItem{Holder: s.Holder, Ticket: s.Ticket, Cost: s.Cost, Left: s.Left}
	}
	return out, nil
}

// decodeLog checks and converts handoff i's sliding log: as many ages as
// costs, at most bucket.MaxSlidingLogLimit entries (a log holds at most one
// per token of its limit), every age >= 0 and every cost >= 1.
func decodeLog(i int, ages, costs []int64) ([]cluster.LogItem, error) {
	switch {
	case len(ages) != len(costs):
		return nil, itemErr("handoffs", i, fmt.Sprintf("%d log ages but %d log costs", len(ages), len(costs)))
	case len(ages) > bucket.MaxSlidingLogLimit:
		return nil, itemErr("handoffs", i, fmt.Sprintf("log of %d entries, more than %d", len(ages), bucket.MaxSlidingLogLimit))
	case len(ages) == 0:
		return nil, nil
	}
	log := make([]cluster.LogItem, len(ages))
	for j := range ages {
		if ages[j] < 0 || costs[j] < 1 {
			return nil, itemErr("handoffs", i, fmt.Sprintf("log entry %d: age %d, cost %d (want age >= 0, cost >= 1)", j, ages[j], costs[j]))
		}
		log[j] = cluster.LogItem{Age: ages[j], Cost: costs[j]}
	}
	return log, nil
}

func itemErr(kind string, i int, problem string) error {
	return fmt.Errorf("%w: %s[%d]: %s", ErrMalformed, kind, i, problem)
}

func checkKey(kind string, i int, rule, identity string) error {
	if p := checkName("rule", rule, cluster.MaxRuleIDBytes); p != "" {
		return itemErr(kind, i, p)
	}
	// Identities are any bytes, possibly empty (a global rule's); only
	// their size is bounded.
	if len(identity) > cluster.MaxIdentityBytes {
		return itemErr(kind, i, fmt.Sprintf("identity of %d bytes, more than %d", len(identity), cluster.MaxIdentityBytes))
	}
	return nil
}

// checkName returns the problem with s, or "" when there is none.
func checkName(field, s string, limit int) string {
	switch {
	case s == "":
		return "empty " + field
	case len(s) > limit:
		return fmt.Sprintf("%s of %d bytes, more than %d", field, len(s), limit)
	case !utf8.ValidString(s):
		return field + " is not valid UTF-8"
	}
	return ""
}

// decodeSyncs converts and validates a batch's syncs (decodeBatch's rules).
func decodeSyncs(in []*peerpb.SyncItem) ([]cluster.SyncItem, error) {
	out := make([]cluster.SyncItem, len(in))
	for i, s := range in {
		if s == nil {
			return nil, itemErr("syncs", i, "nil item")
		}
		if err := checkKey("syncs", i, s.Rule, string(s.Identity)); err != nil {
			return nil, err
		}
		if s.Total < 0 {
			return nil, itemErr("syncs", i, fmt.Sprintf("negative total %d", s.Total))
		}
		if s.Grant < 0 {
			return nil, itemErr("syncs", i, fmt.Sprintf("negative grant %d", s.Grant))
		}
		if s.RefundBase < 0 || s.Refunded < s.RefundBase {
			return nil, itemErr("syncs", i, fmt.Sprintf("refund base %d not within 0..refunded %d", s.RefundBase, s.Refunded))
		}
		if s.Rejected < 0 {
			return nil, itemErr("syncs", i, fmt.Sprintf("negative rejected %d", s.Rejected))
		}
		out[i] = cluster.SyncItem{Rule: s.Rule, Identity: string(s.Identity), Gen: s.Gen, Total: s.Total,
			GrantEpoch: s.GrantEpoch, Grant: s.Grant, Refunded: s.Refunded, RefundBase: s.RefundBase, Rejected: s.Rejected}
	}
	return out, nil
}

package cluster

import (
	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/quota"
)

// Source says how a decision was made.
type Source uint8

const (
	// SourceOwner: this node owns the identity and decided on its bucket.
	SourceOwner Source = iota
	// SourceSlack: admitted locally within this node's slack.
	SourceSlack
	// SourceView: rejected locally because the view of the owner's bucket
	// says the owner would reject it.
	SourceView
	// SourceRemote: decided by the owner over the network.
	SourceRemote
	// SourceFailure: the owner was unreachable and the rule's on_failure
	// decided (Outcome.Degraded is true).
	SourceFailure
	// SourceSketch: admitted locally through a gated rule's sketch, with
	// no entry and no report to the owner (sketch.go).
	SourceSketch
)

// NumSources is the number of Source values (0 to NumSources−1): size
// arrays indexed by Source with it, so that a new Source cannot overflow
// them.
const NumSources = int(SourceSketch) + 1

// Outcome is the coordinator's answer to Decide.
type Outcome struct {
	// Decision is the decision, when Pending is false.
	bucket.Decision
	// Pending is true when the request went to its owner: the decision
	// arrives later as a Completion with Ticket.
	Pending bool
	Ticket  uint64
	// Source says how the decision was made; Degraded is true when the
	// owner could not be reached and on_failure decided.
	Source   Source
	Degraded bool
}

// Completion is the late decision of a pending request.
type Completion struct {
	Ticket  uint64
	Outcome Outcome
}

// Message is everything one node sends another in one batch. Durations are
// nanoseconds measured on the sender; no field is a point in the sender's
// clock.
type Message struct {
	// Epoch is the sender's ring epoch.
	Epoch   uint64
	Syncs   []SyncItem
	Decides []DecideItem
	Acks    []AckItem
	Results []ResultItem
	// Handoffs carry owner state to a new owner after a ring change.
	Handoffs []HandoffItem
	// Blinds report spend admitted without an entry (blind.go), BlindAcks
	// acknowledge such reports, and Tracks tell a node to keep an entry of
	// an identity whose owner bucket is no longer far from its limit.
	Blinds    []BlindItem
	BlindAcks []BlindAck
	Tracks    []TrackItem
	// HandedOver, when not 0, is the digest of the sender's ring
	// (OwnerTable.Digest): the sender has handed over every bucket it
	// owned that this ring assigns to another member. It follows the
	// message's handoffs.
	HandedOver uint64
}

// Empty reports whether m carries nothing.
func (m *Message) Empty() bool {
	return len(m.Decides) == 0 && len(m.Results) == 0 && len(m.Syncs) == 0 && len(m.Acks) == 0 &&
		len(m.Handoffs) == 0 && len(m.Blinds) == 0 && len(m.BlindAcks) == 0 && len(m.Tracks) == 0 && m.HandedOver == 0
}

// Items returns the number of items of all kinds in m.
func (m *Message) Items() int {
	return len(m.Syncs) + len(m.Decides) + len(m.Acks) + len(m.Results) + len(m.Handoffs) + len(m.Blinds) +
		len(m.BlindAcks) + len(m.Tracks)
}

// Split returns m cut into messages of at most n items each (m itself when
// it fits), in the order Coordinator.Step takes them: handoffs, then blind
// reports, syncs, decides, acks, blind acknowledgements, tracks and
// results, so that a receiver stepping them in order sees an identity's
// handed-over state before the reports that follow it. A blind report is
// never cut: one longer than n is a message of its own.
func (m *Message) Split(n int) []Message {
	if n <= 0 || m.Items() <= n {
		return []Message{*m}
	}
	var out []Message
	cur := Message{Epoch: m.Epoch}
	room := n
	next := func() {
		out = append(out, cur)
		cur, room = Message{Epoch: m.Epoch}, n
	}
	take := func(k int) int {
		if room == 0 {
			next()
		}
		t := min(k, room)
		room -= t
		return t
	}
	for rest := m.Handoffs; len(rest) > 0; {
		t := take(len(rest))
		cur.Handoffs, rest = append(cur.Handoffs, rest[:t]...), rest[t:]
	}
	for rest := m.Blinds; len(rest) > 0; {
		k := BlindReportLen(rest)
		if room < k && room < n {
			next()
		}
		room = max(room-k, 0)
		cur.Blinds, rest = append(cur.Blinds, rest[:k]...), rest[k:]
	}
	for rest := m.Syncs; len(rest) > 0; {
		t := take(len(rest))
		cur.Syncs, rest = append(cur.Syncs, rest[:t]...), rest[t:]
	}
	for rest := m.Decides; len(rest) > 0; {
		t := take(len(rest))
		cur.Decides, rest = append(cur.Decides, rest[:t]...), rest[t:]
	}
	for rest := m.Acks; len(rest) > 0; {
		t := take(len(rest))
		cur.Acks, rest = append(cur.Acks, rest[:t]...), rest[t:]
	}
	for rest := m.BlindAcks; len(rest) > 0; {
		t := take(len(rest))
		cur.BlindAcks, rest = append(cur.BlindAcks, rest[:t]...), rest[t:]
	}
	for rest := m.Tracks; len(rest) > 0; {
		t := take(len(rest))
		cur.Tracks, rest = append(cur.Tracks, rest[:t]...), rest[t:]
	}
	for rest := m.Results; len(rest) > 0; {
		t := take(len(rest))
		cur.Results, rest = append(cur.Results, rest[:t]...), rest[t:]
	}
	if cur.Items() > 0 {
		out = append(out, cur)
	}
	out[len(out)-1].HandedOver = m.HandedOver
	return out
}

// BlindReportLen returns the number of items of the blind report that
// blinds starts with: those of its first item's stream and sequence
// number, which sit next to each other (0 when blinds is empty).
func BlindReportLen(blinds []BlindItem) int {
	if len(blinds) == 0 {
		return 0
	}
	k := 1
	for k < len(blinds) && blinds[k].Stream == blinds[0].Stream && blinds[k].Seq == blinds[0].Seq {
		k++
	}
	return k
}

// SyncItem reports a node's cumulative spend on an identity under a rule,
// for one generation of the node's entry.
type SyncItem struct {
	Rule     string
	Identity string
	Gen      uint64
	Total    int64
	// GrantEpoch is the highest demand grant epoch the node adopted for
	// this generation (0: none) and Grant the extra slack it uses under it
	// now (0 once lapsed): demand-following slack only (slack.go).
	GrantEpoch uint64
	Grant      int64
	// Refunded is the cumulative tokens of this generation's admissions
	// that the node asks the owner to give back (requests another rule
	// then rejected: Coordinator.Refund), and RefundBase the part of it
	// the owner must not give back (acknowledged already, or given up by
	// the node): the owner gives back what of (RefundBase, Refunded] it
	// has not given back yet, so that a repeated or reordered report
	// never gives back twice. An owner that does not know the fields
	// gives nothing back.
	Refunded, RefundBase int64
	// Rejected is the cumulative tokens of this generation's requests the
	// node rejected on its view of the owner's bucket, for a rule leased
	// from the lease group (CoordinatorConfig.Shares): the owner observes
	// what is new of it as rejected demand, so that the demand its region
	// reports counts every request of the region, not only those the
	// owner decided and the spend it was charged. A lost sync loses only
	// its part of that count: demand is what the region asks for, never
	// what it may admit.
	Rejected int64
}

// AckItem acknowledges a SyncItem: the highest Total the owner has charged
// for (Rule, Identity, Gen), and the owner's bucket after it as Debt
// (TAT − now in ns; ≤ 0 when full). Under demand-following slack it also
// carries the owner's latest grant to the node for the generation:
// GrantEpoch, and Grant, the extra slack beyond the base (slack.go).
// Refunded is the highest SyncItem.Refunded the owner has taken for the
// generation (given back, or not to be given back).
type AckItem struct {
	Rule       string
	Identity   string
	Gen        uint64
	Total      int64
	Debt       int64
	GrantEpoch uint64
	Grant      int64
	Refunded   int64
}

// DecideItem asks the owner to decide a request. (DecideInto writes every
// field of a new item in place: a field added here must be written there.)
type DecideItem struct {
	Ticket   uint64
	Rule     string
	Identity string
	Cost     int64
	// h is Identity's hashID when this process's Decide made the item
	// (0: not known): a receiver in the same process (the simulator, an
	// in-memory transport) then need not hash it again. hashID's seed is
	// one per process, so the value is good for every coordinator here;
	// it never goes on the wire (wire.go builds items without it).
	h uint64
	// Release is set on an item that gives back the concurrency slot the
	// sender's request with Ticket took (Coordinator.Release): the owner
	// frees it and answers nothing.
	Release bool
}

// ResultItem is the owner's decision of a DecideItem, with its bucket after
// it as Debt. Delay (ns, leaky_bucket rules only) is how long the asking
// node holds the admitted request: counted from when it receives the
// result, so the owner's spacing holds up to the spread of one-way delays
// between the nodes. (decideFor writes every field of a new item in place:
// a field added here must be written there.)
type ResultItem struct {
	Ticket     uint64
	Allowed    bool
	Remaining  int64
	Reset      int64
	RetryAfter int64
	Debt       int64
	Delay      int64
}

// HandoffItem hands an identity's bucket (as Debt) to its new owner. Debt
// is, for a gcra rule, the bucket's TAT from now; for a leaky_bucket rule
// the time until its queue drains (the handed queue is appended to the new
// owner's, as debts add); for a fixed_window rule the time until the window
// ends (ns), and Count the tokens counted in it; for a sliding_window rule
// the time until the current window ends, Span its length (ns), Count its
// tokens and Prev the previous window's; for a sliding_log rule the time
// until the newest admission leaves the window, and Log the admissions
// still in view. Count, Prev, Span and Log are zero for the algorithms that
// do not use them.
//
// Algorithm, Limit, Window, Burst and MaxDelay are the parameters of the
// rule the state was written under: a new owner whose rule has changed
// since converts the state to its rule as SetRules converts its own
// buckets (an algorithm changed: the identity starts over). Limit 0 means
// unknown: the state is read under the new owner's rule as it is.
type HandoffItem struct {
	Rule      string
	Identity  string
	Debt      int64
	Count     int64
	Prev      int64
	Span      int64 // ns
	Log       []LogItem
	Algorithm quota.Algorithm
	Limit     int64
	Window    int64 // ns
	Burst     int64
	MaxDelay  int64 // ns
	// Slots are a concurrency rule's slots in flight.
	Slots []SlotItem
}

// BlindItem is spend a node admitted for an identity it keeps no entry of
// (blind spend, blind.go): Cost tokens of Identity under Rule, to be
// charged by the identity's owner. The items of one report share Stream
// (the sending coordinator's, CoordinatorConfig.Stream) and Seq, sit next
// to each other in a message and are never cut between messages: an
// owner charges a report whose Seq is above the highest it charged for
// (sender, Stream) and then acknowledges it, so a report sent again is
// charged once.
type BlindItem struct {
	Stream, Seq    uint64
	Rule, Identity string
	Cost           int64
}

// BlindAck acknowledges the blind report (Stream, Seq): its owner has
// charged every item of it.
type BlindAck struct {
	Stream, Seq uint64
}

// TrackItem tells a node to keep an entry of Identity under Rule, with
// its view of the owner's bucket at Debt (TAT − now in ns, as in
// AckItem): the owner charged blind spend of the identity and its bucket
// is no longer far from its limit, or the owner keeps a bucket of it.
type TrackItem struct {
	Rule, Identity string
	Debt           int64
}

// LogItem is one admission of a handed sliding log: Age ns before the
// sender's now, of Cost tokens.
type LogItem struct {
	Age, Cost int64
}

// Envelope is a message and its destination.
type Envelope struct {
	To  string
	Msg Message
}

// Ready is what the adapter must do after a round of calls: send Messages
// and hand out Completions.
type Ready struct {
	Messages    []Envelope
	Completions []Completion
}

// Limits of one batch on the wire.
const (
	// MaxNodeNameBytes caps Batch.from (memberlist names are far shorter).
	MaxNodeNameBytes = 256
	// MaxRuleIDBytes caps a rule id.
	MaxRuleIDBytes = 128
	// MaxIdentityBytes caps an identity.
	MaxIdentityBytes = 1024
	// MaxBatchItems caps the items of all kinds in one batch.
	MaxBatchItems = 65536
)

package lease

import (
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/weir-dev/weir/lease/leasepb"
)

// This file is the codec of the lease group's Raft log entries: the
// conversion between the machine's types and the log's wire messages
// (lease/leasepb), which the forwarding service (lease/raftgroup) also
// carries to the leader.
//
// An entry is one format byte and a body:
//
//	entryNoop    (0): no body; the FSM applies nothing (benchmarks, probes)
//	entryCommand (1): a leasepb.Command, protobuf-encoded: a lease Machine
//	                  command (report, takeover, rules, tick), a rule
//	                  store change (put_rule, delete_rule), or a durable
//	                  rule's decision (durable)
//
// Any other first byte is refused, so a later format can be told apart from
// this one. A put_rule carries the rule as its canonical JSON
// (EncodeRuleJSON), decoded strictly: an unknown field is a malformed
// entry, not a field silently dropped.

// Entry formats.
const (
	entryNoop    byte = 0
	entryCommand byte = 1
)

// MaxEntryBytes is the largest log entry DecodeEntry accepts.
const MaxEntryBytes = 4 << 20

// ErrMalformedEntry is wrapped by every error DecodeEntry returns.
var ErrMalformedEntry = errors.New("lease: malformed log entry")

// Entry is one decoded log entry: a lease Machine command, a rule store
// change or a durable rule's decision. At most one field is set; none is a
// no-op entry.
type Entry struct {
	Command *Command
	Rule    *RuleChange
	Durable *DurableCommand
}

// EncodeDurable encodes a durable decision as a log entry. It fails,
// wrapping ErrBadCommand, if the command is malformed (DurableStore.Apply
// would refuse it).
func EncodeDurable(c DurableCommand) ([]byte, error) {
	pc, err := durableToPB(c)
	if err != nil {
		return nil, err
	}
	return encodePB(pc)
}

// durableToPB converts and checks a durable command.
func durableToPB(c DurableCommand) (*leasepb.Command, error) {
	if _, err := c.check(); err != nil {
		return nil, err
	}
	return &leasepb.Command{Now: c.Now, Kind: &leasepb.Command_Durable{Durable: DurableToPB(c)}}, nil
}

// DurableToPB converts a durable command to its wire form, without checking
// it (DurableCommand.Check does); the forwarding service carries it to a
// voter in that form.
func DurableToPB(c DurableCommand) *leasepb.DurableDecide {
	return &leasepb.DurableDecide{Rule: c.Rule.ID, Limit: c.Rule.Limit, Window: int64(c.Rule.Window), Burst: c.Rule.Burst,
		Identity: []byte(c.Identity), Cost: c.Cost, RequestId: c.RequestID, LegacyIdentity: []byte(c.Legacy), KeyFormat: c.KeyFormat}
}

// DurableFromPB converts and checks the form of a wire durable command,
// stamping it with now: a missing message is an error, a malformed command
// one wrapping ErrBadCommand.
func DurableFromPB(now int64, d *leasepb.DurableDecide) (DurableCommand, error) {
	if d == nil {
		return DurableCommand{}, errors.New("durable is missing")
	}
	c := DurableCommand{Now: now, RequestID: d.GetRequestId(), Identity: string(d.GetIdentity()), Cost: d.GetCost(),
		Rule:   DurableRule{ID: d.GetRule(), Limit: d.GetLimit(), Window: time.Duration(d.GetWindow()), Burst: d.GetBurst()},
		Legacy: string(d.GetLegacyIdentity()), KeyFormat: d.GetKeyFormat()}
	if _, err := c.check(); err != nil {
		return DurableCommand{}, fmt.Errorf("durable: %w", err)
	}
	return c, nil
}

// EncodeEntry encodes c as a log entry. It fails, wrapping ErrBadCommand, if
// c does not set exactly one kind.
func EncodeEntry(c Command) ([]byte, error) {
	pc, err := commandToPB(c)
	if err != nil {
		return nil, err
	}
	return encodePB(pc)
}

// EncodeRuleChange encodes a rule store change as a log entry. It fails,
// wrapping ErrBadCommand, unless exactly one of Put and Delete is set, or
// if the rule cannot be encoded. It checks the form only: RuleStore.Apply
// validates the rule.
func EncodeRuleChange(c RuleChange) ([]byte, error) {
	pc, err := ruleChangeToPB(c)
	if err != nil {
		return nil, err
	}
	return encodePB(pc)
}

// EncodeLogEntry encodes an entry of any kind (DecodeLogEntry's inverse);
// the zero Entry is the no-op entry. It fails, wrapping ErrBadCommand, if
// e holds more than one kind or the one it holds cannot be encoded.
func EncodeLogEntry(e Entry) ([]byte, error) {
	switch {
	case e == (Entry{}):
		return []byte{entryNoop}, nil
	case e.Command != nil && e.Rule == nil:
		return EncodeEntry(*e.Command)
	case e.Rule != nil && e.Command == nil:
		return EncodeRuleChange(*e.Rule)
	}
	pc, err := EntryToPB(e)
	if err != nil {
		return nil, err
	}
	return encodePB(pc)
}

func encodePB(pc *leasepb.Command) ([]byte, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(pc)
	if err != nil {
		return nil, fmt.Errorf("lease: encoding a command: %w", err)
	}
	if len(b)+1 > MaxEntryBytes {
		return nil, fmt.Errorf("%w: the entry would be %d bytes, over %d", ErrBadCommand, len(b)+1, MaxEntryBytes)
	}
	return append([]byte{entryCommand}, b...), nil
}

// DecodeEntry decodes a log entry holding a lease Machine command. ok is
// false for an entry that holds none: a no-op, or a rule store change
// (DecodeLogEntry reads every kind). A malformed entry returns an error
// wrapping ErrMalformedEntry; it never panics. A decoded command may still
// be refused by Machine.Apply (an unknown rule, a bad rule set): the codec
// checks the form, the machine the meaning.
func DecodeEntry(b []byte) (c Command, ok bool, err error) {
	e, err := DecodeLogEntry(b)
	if err != nil || e.Command == nil {
		return Command{}, false, err
	}
	return *e.Command, true, nil
}

// DecodeLogEntry decodes a log entry of any kind; the zero Entry is a
// no-op. A malformed entry returns an error wrapping ErrMalformedEntry; it
// never panics. The codec checks the form only: Machine.Apply and
// RuleStore.Apply check the meaning.
func DecodeLogEntry(b []byte) (Entry, error) {
	switch {
	case len(b) == 0:
		return Entry{}, fmt.Errorf("%w: empty", ErrMalformedEntry)
	case len(b) > MaxEntryBytes:
		return Entry{}, fmt.Errorf("%w: %d bytes, over %d", ErrMalformedEntry, len(b), MaxEntryBytes)
	case b[0] == entryNoop:
		if len(b) != 1 {
			return Entry{}, fmt.Errorf("%w: a no-op entry with a %d-byte body", ErrMalformedEntry, len(b)-1)
		}
		return Entry{}, nil
	case b[0] != entryCommand:
		return Entry{}, fmt.Errorf("%w: unknown format %d", ErrMalformedEntry, b[0])
	}
	var pc leasepb.Command
	if err := proto.Unmarshal(b[1:], &pc); err != nil {
		return Entry{}, fmt.Errorf("%w: %w", ErrMalformedEntry, err)
	}
	e, err := EntryFromPB(&pc)
	if err != nil {
		return Entry{}, fmt.Errorf("%w: %w", ErrMalformedEntry, err)
	}
	return e, nil
}

// ruleChangeToPB converts a rule change; it fails, wrapping ErrBadCommand,
// unless exactly one of Put and Delete is set.
func ruleChangeToPB(c RuleChange) (*leasepb.Command, error) {
	pc := &leasepb.Command{Now: c.Now}
	switch {
	case c.Put != nil && c.Delete == "":
		b, err := EncodeRuleJSON(*c.Put)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrBadCommand, err)
		}
		pc.Kind = &leasepb.Command_PutRule{PutRule: &leasepb.RulePut{Principal: c.Principal, Rule: b, RequestId: c.RequestID}}
	case c.Put == nil && c.Delete != "":
		pc.Kind = &leasepb.Command_DeleteRule{DeleteRule: &leasepb.RuleDelete{Principal: c.Principal, Id: c.Delete, RequestId: c.RequestID}}
	default:
		return nil, fmt.Errorf("%w: a rule change must set exactly one of put and delete", ErrBadCommand)
	}
	return pc, nil
}

// EntryToPB converts an entry of any kind to the wire command that a log
// entry holds and a forwarded proposal carries; it fails, wrapping
// ErrBadCommand, unless the entry holds exactly one kind.
func EntryToPB(e Entry) (*leasepb.Command, error) {
	switch {
	case e.Command != nil && e.Rule == nil && e.Durable == nil:
		return commandToPB(*e.Command)
	case e.Rule != nil && e.Command == nil && e.Durable == nil:
		return ruleChangeToPB(*e.Rule)
	case e.Durable != nil && e.Command == nil && e.Rule == nil:
		return durableToPB(*e.Durable)
	}
	return nil, fmt.Errorf("%w: an entry must hold exactly one of a command, a rule change and a durable decision", ErrBadCommand)
}

// EntryFromPB converts and checks the form of a wire command of any kind
// (DecodeLogEntry after the format byte, and a forwarded proposal).
func EntryFromPB(pc *leasepb.Command) (Entry, error) {
	switch k := pc.GetKind().(type) {
	case *leasepb.Command_PutRule:
		if k.PutRule == nil {
			return Entry{}, errors.New("put_rule is missing")
		}
		r, err := DecodeRuleJSON(k.PutRule.GetRule())
		if err != nil {
			return Entry{}, fmt.Errorf("put_rule: %w", err)
		}
		return Entry{Rule: &RuleChange{Now: pc.GetNow(), Principal: k.PutRule.GetPrincipal(), RequestID: k.PutRule.GetRequestId(), Put: &r}}, nil
	case *leasepb.Command_DeleteRule:
		if k.DeleteRule.GetId() == "" {
			return Entry{}, errors.New("delete_rule with no id")
		}
		return Entry{Rule: &RuleChange{Now: pc.GetNow(), Principal: k.DeleteRule.GetPrincipal(), RequestID: k.DeleteRule.GetRequestId(),
			Delete: k.DeleteRule.GetId()}}, nil
	case *leasepb.Command_Durable:
		c, err := DurableFromPB(pc.GetNow(), k.Durable)
		if err != nil {
			return Entry{}, err
		}
		return Entry{Durable: &c}, nil
	}
	c, err := commandFromPB(pc)
	if err != nil {
		return Entry{}, err
	}
	return Entry{Command: &c}, nil
}

// commandToPB converts c; it fails, wrapping ErrBadCommand, unless exactly
// one kind is set.
func commandToPB(c Command) (*leasepb.Command, error) {
	pc := &leasepb.Command{Now: c.Now}
	n := 0
	if c.Report != nil {
		n++
		r := c.Report
		pr := &leasepb.Report{Reporter: r.Reporter, Seq: r.Seq, Region: r.Region, Items: make([]*leasepb.ReportItem, len(r.Items))}
		for i, it := range r.Items {
			pr.Items[i] = &leasepb.ReportItem{Rule: it.Rule, Identity: []byte(it.Identity), Demand: it.Demand,
				AckEpoch: it.AckEpoch, Debt: it.Debt, Capped: it.Capped, Cap: it.Cap}
		}
		pc.Kind = &leasepb.Command_Report{Report: pr}
	}
	if c.Takeover {
		n++
		pc.Kind = &leasepb.Command_Takeover{Takeover: true}
	}
	if c.Rules != nil {
		n++
		rs := &leasepb.RuleSet{Rules: make([]*leasepb.Rule, len(c.Rules))}
		for i, r := range c.Rules {
			rs.Rules[i] = &leasepb.Rule{Id: r.ID, Limit: r.Limit, Window: int64(r.Window), Burst: r.Burst, MaxCost: r.MaxCost}
		}
		pc.Kind = &leasepb.Command_Rules{Rules: rs}
	}
	if c.Tick {
		n++
		pc.Kind = &leasepb.Command_Tick{Tick: true}
	}
	if n != 1 {
		return nil, fmt.Errorf("%w: %d kinds set, want exactly one", ErrBadCommand, n)
	}
	return pc, nil
}

// commandFromPB converts and checks the form of a wire command.
func commandFromPB(pc *leasepb.Command) (Command, error) {
	c := Command{Now: pc.GetNow()}
	switch k := pc.GetKind().(type) {
	case nil:
		return Command{}, errors.New("no command kind set")
	case *leasepb.Command_Takeover:
		if !k.Takeover {
			return Command{}, errors.New("takeover set to false")
		}
		c.Takeover = true
	case *leasepb.Command_Tick:
		if !k.Tick {
			return Command{}, errors.New("tick set to false")
		}
		c.Tick = true
	case *leasepb.Command_Rules:
		c.Rules = make([]Rule, 0, len(k.Rules.GetRules()))
		for i, r := range k.Rules.GetRules() {
			if r == nil {
				return Command{}, fmt.Errorf("rule %d is missing", i)
			}
			c.Rules = append(c.Rules, Rule{ID: r.GetId(), Limit: r.GetLimit(), Window: time.Duration(r.GetWindow()),
				Burst: r.GetBurst(), MaxCost: r.GetMaxCost()})
		}
	case *leasepb.Command_Report:
		pr := k.Report
		if pr == nil {
			return Command{}, errors.New("report is missing")
		}
		r := &Report{Reporter: pr.GetReporter(), Seq: pr.GetSeq(), Region: pr.GetRegion(), Items: make([]ReportItem, 0, len(pr.GetItems()))}
		for i, it := range pr.GetItems() {
			if it == nil {
				return Command{}, fmt.Errorf("report item %d is missing", i)
			}
			r.Items = append(r.Items, ReportItem{Rule: it.GetRule(), Identity: string(it.GetIdentity()), Demand: it.GetDemand(),
				AckEpoch: it.GetAckEpoch(), Debt: it.GetDebt(), Capped: it.GetCapped(), Cap: it.GetCap()})
		}
		c.Report = r
	default:
		return Command{}, fmt.Errorf("unknown command kind %T", k)
	}
	return c, nil
}

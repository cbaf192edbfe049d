package shell

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/weir-dev/weir/cluster"

	"google.golang.org/protobuf/proto"

	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/cluster/peerpb"
	"github.com/weir-dev/weir/quota"
)

// fullMessage sets every field of every item kind, with edge values: zero
// and negative debts, the largest tickets and generations, RetryAfter Never.
func fullMessage() *cluster.Message {
	return &cluster.Message{
		Epoch: math.MaxUint64 - 1,
		Syncs: []cluster.SyncItem{
			{Rule: "api", Identity: "user:1", Gen: 1, Total: 5, Refunded: 4, RefundBase: 1, Rejected: 7},
			{Rule: "api", Identity: "ключ/✓", Gen: math.MaxUint64, Total: math.MaxInt64, GrantEpoch: math.MaxUint64, Grant: math.MaxInt64,
				Refunded: math.MaxInt64, RefundBase: math.MaxInt64},
		},
		Decides: []cluster.DecideItem{
			{Ticket: 1, Rule: "login", Identity: "10.0.0.1", Cost: 0},
			{Ticket: math.MaxUint64, Rule: "login", Identity: strings.Repeat("i", cluster.MaxIdentityBytes), Cost: 3},
			{Ticket: 1<<63 | 5, Rule: "conc", Identity: "user:7", Cost: 1, Release: true},
		},
		Acks: []cluster.AckItem{
			{Rule: "api", Identity: "user:1", Gen: 1, Total: 5, Debt: -1_000_000, GrantEpoch: 3, Grant: 12, Refunded: 4},
			{Rule: strings.Repeat("r", cluster.MaxRuleIDBytes), Identity: "x", Gen: 0, Total: 0, Debt: math.MinInt64},
		},
		Results: []cluster.ResultItem{
			{Ticket: 7, Allowed: true, Remaining: 4, Reset: 250_000_000, RetryAfter: 0, Debt: 42, Delay: 30_000_000},
			{Ticket: 8, Allowed: false, Remaining: 0, Reset: 1, RetryAfter: int64(bucket.Never), Debt: math.MaxInt64},
		},
		Handoffs: []cluster.HandoffItem{
			{Rule: "api", Identity: "user:2", Debt: -5},
			{Rule: "api", Identity: "user:3", Debt: 0},
			{Rule: "fw", Identity: "user:4", Debt: 59_000_000_000, Count: math.MaxInt64},
			{Rule: "sw", Identity: "user:5", Debt: 400_000_000, Count: 3, Prev: 9, Span: 1_000_000_000,
				Algorithm: quota.AlgorithmSlidingWindow, Limit: 10, Window: 1_000_000_000, Burst: 10},
			{Rule: "log", Identity: "user:6", Debt: 700_000_000, Log: []cluster.LogItem{{Age: 300_000_000, Cost: 2}, {Age: 0, Cost: 1}},
				Algorithm: quota.AlgorithmSlidingLog, Limit: 5, Window: 1_000_000_000, Burst: 5},
			{Rule: "conc", Identity: "user:7", Debt: 60_000_000_000, Slots: []cluster.SlotItem{
				{Holder: "node-b", Ticket: 12, Cost: 2, Left: 59_000_000_000}, {Holder: "", Ticket: 0, Cost: 1, Left: 1}},
				Algorithm: quota.AlgorithmConcurrency, Limit: 5, Window: 60_000_000_000, Burst: 5},
		},
		Blinds: []cluster.BlindItem{
			{Stream: 1, Seq: 1, Rule: "api", Identity: "user:8", Cost: 1},
			{Stream: 1, Seq: 1, Rule: "api", Identity: "", Cost: 0},
			{Stream: 1, Seq: 1, Rule: "login", Identity: "user:8", Cost: 2},
			{Stream: 1, Seq: 1, Rule: "api", Identity: "user:9", Cost: 3},
			{Stream: math.MaxUint64, Seq: math.MaxUint64, Rule: "login", Identity: "\xff", Cost: math.MaxInt64},
		},
		BlindAcks:  []cluster.BlindAck{{Stream: 1, Seq: 1}, {Stream: math.MaxUint64, Seq: 7}},
		Tracks:     []cluster.TrackItem{{Rule: "api", Identity: "user:8", Debt: -3}, {Rule: "api", Identity: "user:9", Debt: math.MaxInt64}},
		HandedOver: math.MaxUint64,
	}
}

func TestWireRoundTrip(t *testing.T) {
	for name, m := range map[string]*cluster.Message{"full": fullMessage(), "empty": {}, "epoch only": {Epoch: 9}, "handed over only": {HandedOver: 3}} {
		t.Run(name, func(t *testing.T) {
			raw, err := proto.Marshal(encodeBatch("node-a", m))
			if err != nil {
				t.Fatal(err)
			}
			var b peerpb.Batch
			if err := proto.Unmarshal(raw, &b); err != nil {
				t.Fatal(err)
			}
			from, got, err := decodeBatch(&b)
			if err != nil {
				t.Fatal(err)
			}
			if from != "node-a" {
				t.Errorf("from = %q, want node-a", from)
			}
			if !reflect.DeepEqual(got, m) {
				t.Errorf("round trip:\n got %+v\nwant %+v", got, m)
			}
		})
	}
}

func TestDecodeBatchRejects(t *testing.T) {
	long := func(n int) string { return strings.Repeat("x", n) }
	tooMany := make([]*peerpb.HandoffItem, cluster.MaxBatchItems+1)
	for i := range tooMany {
		tooMany[i] = &peerpb.HandoffItem{Rule: "r", Identity: []byte("i")}
	}
	cases := []struct {
		name string
		b    *peerpb.Batch
		want string // in the error
	}{
		{"nil batch", nil, "nil batch"},
		{"empty from", &peerpb.Batch{}, "empty from"},
		{"long from", &peerpb.Batch{From: long(cluster.MaxNodeNameBytes + 1)}, "from of 257 bytes"},
		{"bad utf8 from", &peerpb.Batch{From: "a\xff"}, "from is not valid UTF-8"},
		{"too many items", &peerpb.Batch{From: "n", Handoffs: tooMany}, "65537 items"},
		{"nil sync", &peerpb.Batch{From: "n", Syncs: []*peerpb.SyncItem{nil}}, "syncs[0]: nil item"},
		{"empty rule", &peerpb.Batch{From: "n", Syncs: []*peerpb.SyncItem{{Identity: []byte("i")}}}, "syncs[0]: empty rule"},
		{"long rule", &peerpb.Batch{From: "n", Acks: []*peerpb.AckItem{{Rule: long(cluster.MaxRuleIDBytes + 1), Identity: []byte("i")}}}, "acks[0]: rule of 129 bytes"},
		{"long identity", &peerpb.Batch{From: "n", Decides: []*peerpb.DecideItem{{Ticket: 1, Rule: "r", Identity: []byte(long(cluster.MaxIdentityBytes + 1))}}}, "decides[0]: identity of 1025 bytes"},
		{"negative total", &peerpb.Batch{From: "n", Syncs: []*peerpb.SyncItem{{Rule: "r", Identity: []byte("i"), Total: 1}, {Rule: "r", Identity: []byte("i"), Total: -1}}}, "syncs[1]: negative total -1"},
		{"negative ack total", &peerpb.Batch{From: "n", Acks: []*peerpb.AckItem{{Rule: "r", Identity: []byte("i"), Total: -2}}}, "acks[0]: negative total"},
		{"negative sync grant", &peerpb.Batch{From: "n", Syncs: []*peerpb.SyncItem{{Rule: "r", Identity: []byte("i"), Grant: -1}}}, "syncs[0]: negative grant -1"},
		{"negative ack grant", &peerpb.Batch{From: "n", Acks: []*peerpb.AckItem{{Rule: "r", Identity: []byte("i"), Grant: -3}}}, "acks[0]: negative grant -3"},
		{"negative ack refunded", &peerpb.Batch{From: "n", Acks: []*peerpb.AckItem{{Rule: "r", Identity: []byte("i"), Refunded: -2}}}, "acks[0]: negative refunded -2"},
		{"sync refund base above refunded", &peerpb.Batch{From: "n", Syncs: []*peerpb.SyncItem{{Rule: "r", Identity: []byte("i"), Refunded: 1, RefundBase: 2}}}, "syncs[0]: refund base 2 not within 0..refunded 1"},
		{"negative sync rejected", &peerpb.Batch{From: "n", Syncs: []*peerpb.SyncItem{{Rule: "r", Identity: []byte("i"), Rejected: -4}}}, "syncs[0]: negative rejected -4"},
		{"negative cost", &peerpb.Batch{From: "n", Decides: []*peerpb.DecideItem{{Ticket: 1, Rule: "r", Identity: []byte("i"), Cost: -1}}}, "decides[0]: negative cost -1"},
		{"zero decide ticket", &peerpb.Batch{From: "n", Decides: []*peerpb.DecideItem{{Rule: "r", Identity: []byte("i")}}}, "decides[0]: zero ticket"},
		{"zero result ticket", &peerpb.Batch{From: "n", Results: []*peerpb.ResultItem{{}}}, "results[0]: zero ticket"},
		{"negative remaining", &peerpb.Batch{From: "n", Results: []*peerpb.ResultItem{{Ticket: 1, Remaining: -1}}}, "negative remaining"},
		{"negative reset", &peerpb.Batch{From: "n", Results: []*peerpb.ResultItem{{Ticket: 1, ResetAfter: -1}}}, "negative reset_after"},
		{"negative retry", &peerpb.Batch{From: "n", Results: []*peerpb.ResultItem{{Ticket: 1, RetryAfter: -1}}}, "negative retry_after"},
		{"negative delay", &peerpb.Batch{From: "n", Results: []*peerpb.ResultItem{{Ticket: 1, Delay: -1}}}, "results[0]: negative delay -1"},
		{"handoff log ages and costs differ", &peerpb.Batch{From: "n", Handoffs: []*peerpb.HandoffItem{{Rule: "r", Identity: []byte("i"), LogAges: []int64{1, 2}, LogCosts: []int64{1}}}}, "handoffs[0]: 2 log ages but 1 log costs"},
		{"handoff log negative age", &peerpb.Batch{From: "n", Handoffs: []*peerpb.HandoffItem{{Rule: "r", Identity: []byte("i"), LogAges: []int64{-1}, LogCosts: []int64{1}}}}, "handoffs[0]: log entry 0: age -1"},
		{"handoff log zero cost", &peerpb.Batch{From: "n", Handoffs: []*peerpb.HandoffItem{{Rule: "r", Identity: []byte("i"), LogAges: []int64{5}, LogCosts: []int64{0}}}}, "log entry 0: age 5, cost 0"},
		{"handoff log too long", &peerpb.Batch{From: "n", Handoffs: []*peerpb.HandoffItem{{Rule: "r", Identity: []byte("i"), LogAges: make([]int64, bucket.MaxSlidingLogLimit+1), LogCosts: make([]int64, bucket.MaxSlidingLogLimit+1)}}}, "more than 10000"},
		{"handoff slot zero cost", &peerpb.Batch{From: "n", Handoffs: []*peerpb.HandoffItem{{Rule: "r", Identity: []byte("i"), Slots: []*peerpb.SlotItem{{Holder: "a", Cost: 0, Left: 5}}}}}, "handoffs[0]: slot 0: cost 0, left 5"},
		{"handoff slot lapsed", &peerpb.Batch{From: "n", Handoffs: []*peerpb.HandoffItem{{Rule: "r", Identity: []byte("i"), Slots: []*peerpb.SlotItem{{Cost: 1, Left: 0}}}}}, "slot 0: cost 1, left 0"},
		{"handoff slot nil", &peerpb.Batch{From: "n", Handoffs: []*peerpb.HandoffItem{{Rule: "r", Identity: []byte("i"), Slots: []*peerpb.SlotItem{nil}}}}, "slot 0: nil"},
		{"handoff slot bad holder", &peerpb.Batch{From: "n", Handoffs: []*peerpb.HandoffItem{{Rule: "r", Identity: []byte("i"), Slots: []*peerpb.SlotItem{{Holder: "a\xff", Cost: 1, Left: 1}}}}}, "slot 0: holder is not valid UTF-8"},
		{"handoff too many slots", &peerpb.Batch{From: "n", Handoffs: []*peerpb.HandoffItem{{Rule: "r", Identity: []byte("i"), Slots: make([]*peerpb.SlotItem, bucket.MaxSlidingLogLimit+1)}}}, "10001 slots"},
		{"negative handoff prev", &peerpb.Batch{From: "n", Handoffs: []*peerpb.HandoffItem{{Rule: "r", Identity: []byte("i"), Prev: -1}}}, "handoffs[0]: negative prev -1"},
		{"blind report nil", &peerpb.Batch{From: "n", Blinds: []*peerpb.BlindReport{nil}}, "blinds[0]: nil report"},
		{"blind report zero seq", &peerpb.Batch{From: "n", Blinds: []*peerpb.BlindReport{blindReport(1, 0, "r", "i")}}, "blinds[0]: stream 1, seq 0"},
		{"blind report zero stream", &peerpb.Batch{From: "n", Blinds: []*peerpb.BlindReport{blindReport(0, 1, "r", "i")}}, "blinds[0]: stream 0, seq 1"},
		{"blind report empty", &peerpb.Batch{From: "n", Blinds: []*peerpb.BlindReport{{Stream: 1, Seq: 1}}}, "blinds[0]: a report of no items"},
		{"blind report no lengths", &peerpb.Batch{From: "n", Blinds: []*peerpb.BlindReport{{Stream: 1, Seq: 1, Rules: []string{"r"}, RuleIndex: []uint32{0}, Identities: []byte("i"), Costs: []int64{1}}}}, "blinds[0]: a report of no items"},
		{"blind report short costs", &peerpb.Batch{From: "n", Blinds: []*peerpb.BlindReport{{Stream: 1, Seq: 1, Rules: []string{"r"}, RuleIndex: []uint32{0, 0}, Identities: []byte("ij"), IdentityLengths: []uint32{1, 1}, Costs: []int64{1}}}}, "blinds[0]: 2 rule indexes, 2 identity lengths and 1 costs"},
		{"blind report short index", &peerpb.Batch{From: "n", Blinds: []*peerpb.BlindReport{{Stream: 1, Seq: 1, Rules: []string{"r"}, Identities: []byte("i"), IdentityLengths: []uint32{1}, Costs: []int64{1}}}}, "blinds[0]: 0 rule indexes, 1 identity lengths and 1 costs"},
		{"blind report identities short", &peerpb.Batch{From: "n", Blinds: []*peerpb.BlindReport{{Stream: 1, Seq: 1, Rules: []string{"r"}, RuleIndex: []uint32{0, 0}, Identities: []byte("ij"), IdentityLengths: []uint32{1, 2}, Costs: []int64{1, 1}}}}, "blinds[0]: identity lengths add up to 3 bytes, identities are 2"},
		{"blind report identities long", &peerpb.Batch{From: "n", Blinds: []*peerpb.BlindReport{{Stream: 1, Seq: 1, Rules: []string{"r"}, RuleIndex: []uint32{0}, Identities: []byte("ij"), IdentityLengths: []uint32{1}, Costs: []int64{1}}}}, "blinds[0]: identity lengths add up to 1 bytes, identities are 2"},
		{"blind report lengths overflow", &peerpb.Batch{From: "n", Blinds: []*peerpb.BlindReport{{Stream: 1, Seq: 1, Rules: []string{"r"}, RuleIndex: []uint32{0, 0}, Identities: []byte("i"), IdentityLengths: []uint32{math.MaxUint32, 2}, Costs: []int64{1, 1}}}}, "blinds[0]: identity lengths add up to 4294967297 bytes, identities are 1"},
		{"blind report more rules than items", &peerpb.Batch{From: "n", Blinds: []*peerpb.BlindReport{{Stream: 1, Seq: 1, Rules: []string{"r", "s"}, RuleIndex: []uint32{1}, Identities: []byte("i"), IdentityLengths: []uint32{1}, Costs: []int64{1}}}}, "blinds[0]: 2 rules for 1 items"},
		{"blind report no rules", &peerpb.Batch{From: "n", Blinds: []*peerpb.BlindReport{{Stream: 1, Seq: 1, RuleIndex: []uint32{0}, Identities: []byte("i"), IdentityLengths: []uint32{1}, Costs: []int64{1}}}}, "blinds[0]: item 0: rule index 0 of 0 rules"},
		{"blind item rule index out of range", &peerpb.Batch{From: "n", Blinds: []*peerpb.BlindReport{{Stream: 1, Seq: 1, Rules: []string{"r"}, RuleIndex: []uint32{0, math.MaxUint32}, Identities: []byte("ij"), IdentityLengths: []uint32{1, 1}, Costs: []int64{1, 1}}}}, "blinds[0]: item 1: rule index 4294967295 of 1 rules"},
		{"blind item negative cost", &peerpb.Batch{From: "n", Blinds: []*peerpb.BlindReport{{Stream: 1, Seq: 1, Rules: []string{"r"}, RuleIndex: []uint32{0, 0}, Identities: []byte("ii"), IdentityLengths: []uint32{1, 1}, Costs: []int64{0, -2}}}}, "blinds[0]: item 1: negative cost -2"},
		{"blind item long identity", &peerpb.Batch{From: "n", Blinds: []*peerpb.BlindReport{blindReport(1, 1, "r", strings.Repeat("i", cluster.MaxIdentityBytes+1))}}, "blinds[0]: item 0: identity of"},
		{"blind rule empty", &peerpb.Batch{From: "n", Blinds: []*peerpb.BlindReport{blindReport(1, 1, "", "i")}}, "blinds[0]: rule 0: empty rule"},
		{"blind rule not UTF-8", &peerpb.Batch{From: "n", Blinds: []*peerpb.BlindReport{{Stream: 1, Seq: 1, Rules: []string{"r", "\xff"}, RuleIndex: []uint32{0, 1}, Identities: []byte("ij"), IdentityLengths: []uint32{1, 1}, Costs: []int64{1, 1}}}}, "blinds[0]: rule 1: rule is not valid UTF-8"},
		{"blind rule too long", &peerpb.Batch{From: "n", Blinds: []*peerpb.BlindReport{blindReport(1, 1, strings.Repeat("r", cluster.MaxRuleIDBytes+1), "i")}}, "blinds[0]: rule 0: rule of"},
		{"blind ack zero seq", &peerpb.Batch{From: "n", BlindAcks: []*peerpb.BlindAck{{Stream: 4}}}, "blind_acks[0]: stream 4, seq 0"},
		{"blind ack nil", &peerpb.Batch{From: "n", BlindAcks: []*peerpb.BlindAck{nil}}, "blind_acks[0]: nil item"},
		{"track long identity", &peerpb.Batch{From: "n", Tracks: []*peerpb.TrackItem{{Rule: "r", Identity: []byte(long(cluster.MaxIdentityBytes + 1))}}}, "tracks[0]: identity of 1025 bytes"},
		{"track nil", &peerpb.Batch{From: "n", Tracks: []*peerpb.TrackItem{nil}}, "tracks[0]: nil item"},
		{"too many blind items", &peerpb.Batch{From: "n", Handoffs: tooMany[:cluster.MaxBatchItems], Blinds: []*peerpb.BlindReport{blindReport(1, 1, "r", "")}}, "65537 items"},
		{"negative handoff count", &peerpb.Batch{From: "n", Handoffs: []*peerpb.HandoffItem{{Rule: "r", Identity: []byte("i"), Count: -2}}}, "handoffs[0]: negative count -2"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			from, m, err := decodeBatch(c.b)
			if err == nil {
				t.Fatalf("accepted: from %q, %+v", from, m)
			}
			if !errors.Is(err, ErrMalformed) {
				t.Errorf("error %v does not wrap ErrMalformed", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not name %q", err, c.want)
			}
			if m != nil || from != "" {
				t.Errorf("rejected batch still returned from %q, %+v", from, m)
			}
		})
	}
}

// blindReport is a blind report of one item: cost 1 of identity under rule.
func blindReport(stream, seq uint64, rule, identity string) *peerpb.BlindReport {
	return &peerpb.BlindReport{Stream: stream, Seq: seq, Rules: []string{rule}, RuleIndex: []uint32{0}, Identities: []byte(identity),
		IdentityLengths: []uint32{uint32(len(identity))}, Costs: []int64{1}}
}

// FuzzDecodeBatch feeds arbitrary bytes through proto.Unmarshal and
// decodeBatch: neither may panic, and whatever decodes must survive
// encodeBatch → Marshal → Unmarshal → decodeBatch unchanged.
func FuzzDecodeBatch(f *testing.F) {
	seed := func(from string, m *cluster.Message) {
		raw, err := proto.Marshal(encodeBatch(from, m))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw)
	}
	seed("node-a", fullMessage())
	seed("n", &cluster.Message{})
	seed("n", &cluster.Message{Decides: []cluster.DecideItem{{Ticket: 1, Rule: "r", Identity: "i", Cost: -1}}})
	seed("", &cluster.Message{Syncs: []cluster.SyncItem{{Rule: "r", Identity: "i"}}})
	seed("n", &cluster.Message{Syncs: []cluster.SyncItem{{Rule: "r", Identity: "i", Gen: 3, Total: 9, GrantEpoch: 7, Grant: 4}},
		Acks: []cluster.AckItem{{Rule: "r", Identity: "i", Gen: 3, Total: 9, Debt: -5, GrantEpoch: 8, Grant: 2}}})
	seed("n", &cluster.Message{Acks: []cluster.AckItem{{Rule: "r", Identity: "i", Grant: -1}}})
	seed("n", &cluster.Message{Handoffs: []cluster.HandoffItem{{Rule: "fw", Identity: "i", Debt: 30_000_000_000, Count: 7}}})
	seed("n", &cluster.Message{Handoffs: []cluster.HandoffItem{{Rule: "fw", Identity: "i", Count: -1}}})
	seed("n", &cluster.Message{Results: []cluster.ResultItem{{Ticket: 3, Allowed: true, Remaining: 2, Reset: 40_000_000, Delay: 20_000_000}}})
	seed("n", &cluster.Message{Blinds: []cluster.BlindItem{{Stream: 9, Seq: 2, Rule: "r", Identity: "i", Cost: 1}, {Stream: 9, Seq: 3, Rule: "r", Identity: "j", Cost: 2}},
		BlindAcks: []cluster.BlindAck{{Stream: 5, Seq: 1}}, Tracks: []cluster.TrackItem{{Rule: "r", Identity: "i", Debt: 500}}})
	seed("n", &cluster.Message{Blinds: []cluster.BlindItem{{Stream: 0, Seq: 1, Rule: "r", Identity: "i", Cost: 1}}})
	seed("n", &cluster.Message{Blinds: []cluster.BlindItem{{Stream: 3, Seq: 1, Rule: "r", Identity: "i", Cost: 1}, {Stream: 3, Seq: 1, Rule: "s", Identity: "", Cost: 0},
		{Stream: 3, Seq: 1, Rule: "r", Identity: "k", Cost: 4}, {Stream: 4, Seq: 1, Rule: "s", Identity: "i", Cost: 2}}})
	seed("n", &cluster.Message{Blinds: []cluster.BlindItem{{Stream: 3, Seq: 1, Rule: "r", Identity: "i", Cost: -1}}})
	f.Add([]byte{})
	f.Add([]byte{0x0a, 0x02, 0xff, 0xfe})             // from: invalid UTF-8
	f.Add([]byte{0x1a, 0x80, 0x80, 0x80, 0x80, 0x01}) // a huge length prefix
	f.Fuzz(func(t *testing.T, raw []byte) {
		var b peerpb.Batch
		if proto.Unmarshal(raw, &b) != nil {
			return
		}
		from, m, err := decodeBatch(&b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		raw2, err := proto.Marshal(encodeBatch(from, m))
		if err != nil {
			t.Fatal(err)
		}
		var b2 peerpb.Batch
		if err := proto.Unmarshal(raw2, &b2); err != nil {
			t.Fatal(err)
		}
		from2, m2, err := decodeBatch(&b2)
		if err != nil {
			t.Fatalf("a valid batch failed after a round trip: %v", err)
		}
		if from2 != from || !reflect.DeepEqual(m2, m) {
			t.Fatalf("round trip changed the batch:\n got %q %+v\nwant %q %+v", from2, m2, from, m)
		}
	})
}

// TestIdentityAnyBytes: identities are bytes, not text: a global rule's
// empty identity and a header value that is not UTF-8 cross the wire intact
// (a rejection would fail the whole batch to that peer).
func TestIdentityAnyBytes(t *testing.T) {
	for _, id := range []string{"", "\xff\xfe key", strings.Repeat("k", cluster.MaxIdentityBytes)} {
		in := &cluster.Message{Syncs: []cluster.SyncItem{{Rule: "r", Identity: id, Gen: 1, Total: 1}}}
		raw, err := proto.Marshal(encodeBatch("n", in))
		if err != nil {
			t.Fatalf("identity %q: marshal: %v", id, err)
		}
		var b peerpb.Batch
		if err := proto.Unmarshal(raw, &b); err != nil {
			t.Fatal(err)
		}
		_, out, err := decodeBatch(&b)
		if err != nil {
			t.Fatalf("identity %q rejected: %v", id, err)
		}
		if out.Syncs[0].Identity != id {
			t.Fatalf("identity %q came back as %q", id, out.Syncs[0].Identity)
		}
	}
}

package lease

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// genCommand draws a command of one kind, with the awkward values a peer
// may send: empty and non-UTF-8 identities, negative debts, empty rule sets.
func genCommand(t *rapid.T) Command {
	c := Command{Now: rapid.Int64().Draw(t, "now")}
	switch rapid.IntRange(0, 3).Draw(t, "kind") {
	case 0:
		r := &Report{Reporter: rapid.String().Draw(t, "reporter"), Seq: rapid.Uint64().Draw(t, "seq"),
			Region: rapid.SampledFrom([]string{"ap", "eu", "us", "mars", ""}).Draw(t, "region")}
		for range rapid.IntRange(0, 4).Draw(t, "items") {
			r.Items = append(r.Items, ReportItem{Rule: rapid.SampledFrom([]string{"global", "other", ""}).Draw(t, "rule"),
				Identity: string(rapid.SliceOf(rapid.Byte()).Draw(t, "identity")), Demand: rapid.Int64().Draw(t, "demand"),
				AckEpoch: rapid.Uint64().Draw(t, "ack"), Debt: rapid.Int64().Draw(t, "debt")})
		}
		c.Report = r
	case 1:
		c.Takeover = true
	case 2:
		c.Rules = []Rule{}
		for range rapid.IntRange(0, 3).Draw(t, "rules") {
			c.Rules = append(c.Rules, Rule{ID: rapid.String().Draw(t, "id"), Limit: rapid.Int64().Draw(t, "limit"),
				Window: time.Duration(rapid.Int64().Draw(t, "window")), Burst: rapid.Int64().Draw(t, "burst"),
				MaxCost: rapid.Int64().Draw(t, "maxcost")})
		}
	case 3:
		c.Tick = true
	}
	return c
}

// show prints a command for comparison (nil and empty slices alike).
func show(c Command) string {
	if c.Report != nil {
		return fmt.Sprintf("%d report %+v", c.Now, *c.Report)
	}
	return fmt.Sprintf("%+v", c)
}

// TestEntryRoundTrip: every command with one kind set survives the log
// codec unchanged, and one with none or several is refused.
func TestEntryRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := genCommand(t)
		b, err := EncodeEntry(c)
		if err != nil {
			t.Fatalf("encode %s: %v", show(c), err)
		}
		got, ok, err := DecodeEntry(b)
		if err != nil || !ok {
			t.Fatalf("decode: %v, %v", ok, err)
		}
		if show(got) != show(c) {
			t.Fatalf("round trip: %s, want %s", show(got), show(c))
		}
	})
	for _, c := range []Command{{}, {Tick: true, Takeover: true}, {Rules: []Rule{}, Report: &Report{}}} {
		if _, err := EncodeEntry(c); !errors.Is(err, ErrBadCommand) {
			t.Errorf("encode %+v: %v, want ErrBadCommand", c, err)
		}
	}
}

// entrySeeds are the seed corpus of FuzzDecodeEntry: valid entries of every
// kind, and the malformed ones a reviewer would try first.
func entrySeeds(t testing.TB) [][]byte {
	seeds := [][]byte{nil, {entryNoop}, {entryNoop, 1}, {entryCommand}, {2}, {0xff, 1, 2},
		{entryCommand, 0x18, 0x00},       // takeover = false
		{entryCommand, 0x12, 0x05, 0x0a}, // a report cut short
		{entryCommand, 0x22, 0x02, 0x0a, 0x00}}
	for _, c := range []Command{
		{Now: 1, Takeover: true}, {Now: 2, Tick: true}, {Now: 3, Rules: []Rule{testRule}}, {Now: 4, Rules: []Rule{}},
		{Now: 5, Report: &Report{Reporter: "n1", Seq: 9, Region: "eu",
			Items: []ReportItem{{Rule: "global", Identity: "cust", Demand: 900, AckEpoch: 3, Debt: -5}}}},
	} {
		b, err := EncodeEntry(c)
		if err != nil {
			t.Fatal(err)
		}
		seeds = append(seeds, b, b[:len(b)-1])
	}
	return seeds
}

// FuzzDecodeEntry: the log decoder never panics; what it accepts encodes
// back to a command that decodes the same; and the FSM applies any entry
// (refusing the malformed ones) without panicking.
func FuzzDecodeEntry(f *testing.F) {
	for _, s := range entrySeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, ok, err := DecodeEntry(b)
		if err != nil {
			if !errors.Is(err, ErrMalformedEntry) {
				t.Fatalf("error %v does not wrap ErrMalformedEntry", err)
			}
		} else if ok {
			b2, err := EncodeEntry(c)
			if err != nil {
				t.Fatalf("decoded %s does not encode: %v", show(c), err)
			}
			c2, _, err := DecodeEntry(b2)
			if err != nil || show(c2) != show(c) {
				t.Fatalf("re-encoded %s decodes to %s, %v", show(c), show(c2), err)
			}
		}
		m := newTestMachine(t, "ap", "eu", "us")
		resp := NewReplica(m).Apply(b)
		if (err != nil) != (resp.Err != nil && errors.Is(resp.Err, ErrMalformedEntry)) {
			t.Fatalf("FSM: %v, decoder: %v", resp.Err, err)
		}
		if err := m.Check(); err != nil {
			t.Fatal(err)
		}
	})
}

// randomRun applies a random run to m in the style of the machine tests
// (reports from every region for a few identities, acknowledgements,
// time passing beyond leases, ticks, takeovers, rule changes) and returns
// the next time.
func randomRun(t *rapid.T, m *Machine, now int64, label string) int64 {
	regions := m.Regions()
	for range rapid.IntRange(0, 60).Draw(t, label+" steps") {
		var c Command
		switch rapid.IntRange(0, 9).Draw(t, label+" action") {
		case 0, 1:
			now += rapid.Int64Range(0, int64(20*time.Second)).Draw(t, label+" dt")
			continue
		case 2:
			c.Tick = true
		case 3:
			c.Takeover = true
		case 4:
			rules := []Rule{testRule}
			if rapid.Bool().Draw(t, label+" second rule") {
				rules = append(rules, Rule{ID: "other", Limit: 90, Window: time.Second, Burst: 30, MaxCost: 1})
			}
			c.Rules = rules
		default:
			r := rapid.IntRange(0, len(regions)-1).Draw(t, label+" region")
			rep := &Report{Reporter: regions[r] + "-owner", Seq: rapid.Uint64Range(0, 40).Draw(t, label+" seq"), Region: regions[r]}
			for range rapid.IntRange(1, 3).Draw(t, label+" items") {
				rep.Items = append(rep.Items, ReportItem{Rule: "global",
					Identity: rapid.SampledFrom([]string{"a", "b", "c"}).Draw(t, label+" identity"),
					Demand:   rapid.Int64Range(0, 2*testRule.Limit).Draw(t, label+" demand"),
					AckEpoch: rapid.Uint64Range(0, 6).Draw(t, label+" ack"),
					Debt:     rapid.Int64Range(-int64(time.Second), int64(time.Minute)).Draw(t, label+" debt"),
				})
			}
			c.Report = rep
		}
		c.Now = now
		_, _ = m.Apply(c) // refusals (a rule dropped) are part of the run
		if err := m.Check(); err != nil {
			t.Fatal(err)
		}
	}
	return now
}

// TestStateRoundTrip: after a random run, a machine restored from another's
// MarshalState encodes to the same bytes, and the two stay identical
// (results, states and Check) through a further random run applied to both
// (a differential check that nothing the machine uses is left out of the
// encoding).
func TestStateRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a := machineFor(t, "ap", "eu", "us")
		now := randomRun(t, a, int64(time.Hour), "first")
		b, err := NewMachine(a.cfg)
		if err != nil {
			t.Fatal(err)
		}
		state := a.MarshalState()
		if err := b.RestoreState(state); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b.MarshalState(), state) {
			t.Fatal("the restored machine encodes differently")
		}
		// The same further commands to both.
		for range rapid.IntRange(0, 40).Draw(t, "second steps") {
			now += rapid.Int64Range(0, int64(5*time.Second)).Draw(t, "dt")
			c := Command{Now: now, Tick: true}
			if rapid.Bool().Draw(t, "report") {
				c = Command{Now: now, Report: &Report{Reporter: "eu-owner", Seq: rapid.Uint64Range(0, 80).Draw(t, "seq"), Region: "eu",
					Items: []ReportItem{{Rule: "global", Identity: rapid.SampledFrom([]string{"a", "b", "d"}).Draw(t, "identity"),
						Demand: rapid.Int64Range(0, 2000).Draw(t, "demand"), AckEpoch: rapid.Uint64Range(0, 6).Draw(t, "ack")}}}}
			}
			ra, ea := a.Apply(c)
			rb, eb := b.Apply(c)
			if fmt.Sprint(ra, ea) != fmt.Sprint(rb, eb) {
				t.Fatalf("diverged: %v %v, restored %v %v", ra, ea, rb, eb)
			}
			if fmt.Sprint(a.Check()) != fmt.Sprint(b.Check()) {
				t.Fatal("Check diverged")
			}
		}
		if !bytes.Equal(a.MarshalState(), b.MarshalState()) {
			t.Fatal("states diverged")
		}
	})
}

// TestRestoreRefuses: a state of other regions, a bad rule, or bytes that
// are not a state are refused, and the machine keeps its state.
func TestRestoreRefuses(t *testing.T) {
	m := newTestMachine(t, "ap", "eu", "us")
	if _, err := m.Apply(Command{Now: 5, Report: &Report{Reporter: "x", Seq: 1, Region: "eu",
		Items: []ReportItem{{Rule: "global", Identity: "c", Demand: 10}}}}); err != nil {
		t.Fatal(err)
	}
	want := m.MarshalState()
	other := newTestMachine(t, "ap", "eu")
	badRule := newTestMachine(t, "ap", "eu", "us")
	badRule.rules["zero"] = Rule{ID: "zero"}
	for name, b := range map[string][]byte{
		"empty": nil, "magic": []byte("XYZ\x01"), "version": []byte("WLS\x09"),
		"truncated": want[:len(want)-1], "trailing": append(bytes.Clone(want), 0),
		"other regions": other.MarshalState(), "bad rule": badRule.MarshalState(),
		"huge count": append([]byte("WLS\x01\x00\x00"), 0xff, 0xff, 0xff, 0xff, 0x0f),
	} {
		if err := m.RestoreState(b); !errors.Is(err, ErrBadState) {
			t.Errorf("%s: %v, want ErrBadState", name, err)
		}
		if !bytes.Equal(m.MarshalState(), want) {
			t.Fatalf("%s: a refused state changed the machine", name)
		}
	}
}

// FuzzRestoreState: the state decoder never panics, and a state it
// accepts re-encodes stably and leaves a machine that applies commands
// without panicking.
func FuzzRestoreState(f *testing.F) {
	m := newTestMachine(f, "ap", "eu", "us")
	f.Add(m.MarshalState())
	for i, r := range []string{"ap", "eu", "us"} {
		_, _ = m.Apply(Command{Now: int64(i + 2), Report: &Report{Reporter: r, Seq: 1, Region: r,
			Items: []ReportItem{{Rule: "global", Identity: "c", Demand: int64(100 * (i + 1))}}}})
	}
	full := m.MarshalState()
	f.Add(full)
	f.Add(full[:len(full)/2])
	f.Add([]byte("WLS\x01"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		m := newTestMachine(t, "ap", "eu", "us")
		if err := m.RestoreState(b); err != nil {
			return
		}
		once := m.MarshalState()
		m2 := newTestMachine(t, "ap", "eu", "us")
		if err := m2.RestoreState(once); err != nil || !bytes.Equal(m2.MarshalState(), once) {
			t.Fatalf("re-encoding is not stable: %v", err)
		}
		_ = m.Check()
		_, _ = m.Apply(Command{Now: 1 << 62, Tick: true})
		_, _ = m.Apply(Command{Now: 1 << 62, Report: &Report{Reporter: "eu", Seq: 1 << 40, Region: "eu",
			Items: []ReportItem{{Rule: "global", Identity: "c", Demand: 5, AckEpoch: 1}}}})
	})
}

// machineFor is newTestMachine for rapid's T.
func machineFor(t *rapid.T, regions ...string) *Machine {
	m, err := NewMachine(Config{Regions: regions, LeaseDuration: 10 * time.Second, MaxSkew: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Apply(Command{Now: 1, Rules: []Rule{testRule}}); err != nil {
		t.Fatal(err)
	}
	return m
}

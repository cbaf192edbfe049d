package lease

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/weir-dev/weir/bucket"
)

const day = 24 * time.Hour

// trialRule is "one free trial per account": 1 per 30 days, burst 1.
var trialRule = DurableRule{ID: "trial", Limit: 1, Window: 30 * day, Burst: 1}

func durableCmd(now int64, reqID, identity string) DurableCommand {
	return DurableCommand{Now: now, RequestID: reqID, Rule: trialRule, Identity: identity, Cost: 1}
}

func mustDecide(t testing.TB, s *DurableStore, c DurableCommand) bucket.Decision {
	t.Helper()
	d, err := s.Apply(c)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestDurableStoreTrial: one trial per account per 30 days; the bucket is
// held while spent and dropped on the Tick after it is full again.
func TestDurableStoreTrial(t *testing.T) {
	s := NewDurableStore()
	t0 := int64(1_000_000_000)
	if d := mustDecide(t, s, durableCmd(t0, "", "acct")); !d.Allowed {
		t.Fatalf("first trial refused: %+v", d)
	}
	if d := mustDecide(t, s, durableCmd(t0, "", "other")); !d.Allowed {
		t.Fatalf("another account's trial refused: %+v", d)
	}
	for i, at := range []int64{t0, t0 + int64(time.Second), t0 + int64(29*day)} {
		if d := mustDecide(t, s, durableCmd(at, "", "acct")); d.Allowed || d.RetryAfter <= 0 {
			t.Fatalf("second trial %d admitted at %d: %+v", i, at, d)
		}
	}
	if s.Len() != 2 {
		t.Fatalf("%d buckets held, want 2", s.Len())
	}
	s.Tick(t0 + int64(30*day) - 1)
	if s.Len() != 2 {
		t.Fatalf("%d buckets held a nanosecond before they refill, want 2", s.Len())
	}
	s.Tick(t0 + int64(30*day))
	if s.Len() != 0 {
		t.Fatalf("%d buckets held once full again, want 0", s.Len())
	}
	if d := mustDecide(t, s, durableCmd(t0+int64(30*day), "", "acct")); !d.Allowed {
		t.Fatalf("trial refused after 30 days: %+v", d)
	}
}

// TestDurableStoreRetry: a retried request id is answered from the first
// application and not charged again, within the retry window; after it,
// the id is forgotten.
func TestDurableStoreRetry(t *testing.T) {
	s := NewDurableStore()
	r := DurableRule{ID: "otp", Limit: 5, Window: 15 * time.Minute, Burst: 5}
	c := DurableCommand{Now: 1e9, RequestID: "req-1", Rule: r, Identity: "u", Cost: 1}
	first := mustDecide(t, s, c)
	for range 3 {
		c.Now += int64(time.Second)
		if d := mustDecide(t, s, c); d != first {
			t.Fatalf("retry answered %+v, want the first answer %+v", d, first)
		}
	}
	tat, _ := s.TAT("otp", "u")
	if want := int64(1e9) + int64(3*time.Minute); tat != want {
		t.Fatalf("TAT %d after one charge and three retries, want %d", tat, want)
	}
	c.Now += int64(DurableRetryWindow) + 1
	s.Tick(c.Now)
	if s.Requests() != 0 {
		t.Fatalf("%d request ids remembered after the retry window", s.Requests())
	}
	// 63s later the first charge is partly refilled: charged again, 3 left.
	if d := mustDecide(t, s, c); d == first || d.Remaining != 3 {
		t.Fatalf("a retry after the window: %+v, want charged as new (3 left)", d)
	}
}

// TestDurableStoreLimitChange: the command carries the rule's parameters;
// a changed limit keeps the TAT and GCRA adapts.
func TestDurableStoreLimitChange(t *testing.T) {
	s := NewDurableStore()
	r := DurableRule{ID: "otp", Limit: 10, Window: 10 * time.Second, Burst: 10}
	for range 10 {
		if d := mustDecide(t, s, DurableCommand{Now: 1e9, Rule: r, Identity: "u", Cost: 1}); !d.Allowed {
			t.Fatal("refused within the burst")
		}
	}
	// Spent (0 of 10 tokens at 10/10s). With the limit halved (1 per 2s,
	// burst 5) the bucket still holds 0 tokens: the next one is 2s away.
	r.Limit, r.Burst = 5, 5
	d := mustDecide(t, s, DurableCommand{Now: 1e9, Rule: r, Identity: "u", Cost: 1})
	if d.Allowed {
		t.Fatalf("a lower limit forgave the spent bucket: %+v", d)
	}
	if d.RetryAfter != 2*time.Second {
		t.Fatalf("RetryAfter %v, want 2s", d.RetryAfter)
	}
}

// otpRule is 5 per minute, burst 5: one token every 12 s.
var otpRule = DurableRule{ID: "otp", Limit: 5, Window: time.Minute, Burst: 5}

// admitted applies n commands of rule for identity at now and counts the
// admitted ones.
func admitted(t *testing.T, s *DurableStore, now int64, r DurableRule, identity string, n int) int {
	t.Helper()
	got := 0
	for range n {
		if mustDecide(t, s, DurableCommand{Now: now, Rule: r, Identity: identity, Cost: 1}).Allowed {
			got++
		}
	}
	return got
}

// TestDurableStoreRuleChange: a durable bucket's spend carries over a
// change of its rule as tokens, not as time (docs/durable.md). 5/min burst
// 5 with 1 token spent, one second later raised to 50/min burst 5: the 4
// tokens left are admitted at once (the TAT read under the new interval
// would have rejected them all); lowered to 2/h burst 2 instead: clamped to
// 2.
func TestDurableStoreRuleChange(t *testing.T) {
	const t0 = int64(1_700_000_000) * sec
	s := NewDurableStore()
	if admitted(t, s, t0, otpRule, "raise", 1) != 1 || admitted(t, s, t0, otpRule, "lower", 1) != 1 {
		t.Fatal("first request refused")
	}
	raised := otpRule
	raised.Limit = 50
	if got := admitted(t, s, t0+sec, raised, "raise", 5); got != 4 {
		t.Fatalf("raised to 50/min: %d of the next 5 admitted, want 4 (the tokens held)", got)
	}
	lowered := DurableRule{ID: "otp", Limit: 2, Window: time.Hour, Burst: 2}
	if got := admitted(t, s, t0+2*sec, lowered, "lower", 5); got != 2 {
		t.Fatalf("lowered to 2/h burst 2: %d of the next 5 admitted, want 2 (clamped to the new burst)", got)
	}
}

// TestDurableStoreConvertsAtTheChange: a bucket is converted as of when
// its rule's new parameters first reached the store, not when the bucket
// is next decided. An identity spends its 5 tokens at 5/min (full again in
// 60 s); one second later the rule is raised to 50/min (another identity's
// command brings it); six seconds after that, the first identity's bucket
// is full under the new rule (the 59 s it owed at the change are 5.9 s at
// 1.2 s a token), so 5 pass. Converting only at its own next decision
// would have read the 53 s it owed then under the new interval (5.3 s): 0
// would pass.
func TestDurableStoreConvertsAtTheChange(t *testing.T) {
	const t0 = int64(1_700_000_000) * sec
	s := NewDurableStore()
	if admitted(t, s, t0, otpRule, "a", 5) != 5 {
		t.Fatal("burst refused")
	}
	raised := otpRule
	raised.Limit = 50
	admitted(t, s, t0+sec, raised, "b", 1)
	if got := admitted(t, s, t0+7*sec, raised, "a", 5); got != 5 {
		t.Fatalf("%d of 5 admitted 6 s after the raise, want 5", got)
	}
}

// TestDurableStoreRefuses: malformed commands are refused with
// ErrBadCommand and change nothing.
func TestDurableStoreRefuses(t *testing.T) {
	s := NewDurableStore()
	mustDecide(t, s, durableCmd(5e9, "ok", "acct"))
	before := marshalFullState(emptyMachine(t), nil, s)
	long := string(make([]byte, MaxDurableIdentityBytes+1))
	for name, c := range map[string]DurableCommand{
		"no rule":       {Now: 9e9, Rule: DurableRule{Limit: 1, Window: day, Burst: 1}, Cost: 1},
		"zero cost":     {Now: 9e9, Rule: trialRule, Cost: 0},
		"zero limit":    {Now: 9e9, Rule: DurableRule{ID: "x", Window: day, Burst: 1}, Cost: 1},
		"zero burst":    {Now: 9e9, Rule: DurableRule{ID: "x", Limit: 1, Window: day}, Cost: 1},
		"no window":     {Now: 9e9, Rule: DurableRule{ID: "x", Limit: 1, Burst: 1}, Cost: 1},
		"long identity": {Now: 9e9, Rule: trialRule, Identity: long, Cost: 1},
		"long id":       {Now: 9e9, Rule: trialRule, Cost: 1, RequestID: string(make([]byte, MaxRequestIDBytes+1))},
	} {
		if _, err := s.Apply(c); !errors.Is(err, ErrBadCommand) {
			t.Errorf("%s: %v, want ErrBadCommand", name, err)
		}
		if _, err := EncodeDurable(c); !errors.Is(err, ErrBadCommand) {
			t.Errorf("%s: encode: %v, want ErrBadCommand", name, err)
		}
	}
	if !bytes.Equal(marshalFullState(emptyMachine(t), nil, s), before) {
		t.Fatal("a refused command changed the store")
	}
}

// TestDurableStoreClockBack: the store's time never goes back, so a new
// leader whose clock is behind cannot refill a bucket early.
func TestDurableStoreClockBack(t *testing.T) {
	s := NewDurableStore()
	r := DurableRule{ID: "otp", Limit: 1, Window: time.Minute, Burst: 1}
	mustDecide(t, s, DurableCommand{Now: 100e9, Rule: r, Identity: "u", Cost: 1})
	d := mustDecide(t, s, DurableCommand{Now: 50e9, Rule: r, Identity: "u", Cost: 1})
	if d.Allowed || d.RetryAfter != time.Minute {
		t.Fatalf("a command from a clock 50s behind: %+v, want rejected for a full minute", d)
	}
}

// randomDurableRun applies n random commands and ticks to s, returning
// them, so that another store can replay them.
func randomDurableRun(rng *rand.Rand, n int, now int64) []Entry {
	// Two rules, the second in three parameter sets (its limit, burst and
	// window changing back and forth), so buckets convert.
	rules := []DurableRule{trialRule, {ID: "otp", Limit: 5, Window: 15 * time.Minute, Burst: 3},
		{ID: "otp", Limit: 20, Window: 15 * time.Minute, Burst: 5}, {ID: "otp", Limit: 2, Window: time.Hour, Burst: 2}}
	var out []Entry
	for i := range n {
		now += rng.Int64N(int64(10 * time.Minute))
		if rng.IntN(8) == 0 {
			out = append(out, Entry{Command: &Command{Now: now, Tick: true}})
			continue
		}
		c := DurableCommand{Now: now, Rule: rules[rng.IntN(len(rules))], Identity: fmt.Sprint("id", rng.IntN(6)), Cost: 1 + rng.Int64N(2)}
		if rng.IntN(2) == 0 {
			c.RequestID = fmt.Sprint("r", rng.IntN(i+1)) // some are retries
		}
		out = append(out, Entry{Durable: &c})
	}
	return out
}

// TestDurableDeterministic: replicas that apply the same entries reach the
// same bytes, and a replica restored from a snapshot midway continues to
// the same bytes and the same decisions.
func TestDurableDeterministic(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 7))
		run := randomDurableRun(rng, 300, 1e9)
		a, b := NewReplica(emptyMachine(t)), NewReplica(emptyMachine(t))
		var c *Replica
		for i, e := range run {
			data, err := EncodeLogEntry(e)
			if err != nil {
				t.Fatalf("seed %d entry %d: %v", seed, i, err)
			}
			ra := a.Apply(data)
			rb := b.Apply(data)
			if ra.Err != nil || rb.Err != nil || ra.Durable != rb.Durable {
				t.Fatalf("seed %d entry %d: %+v vs %+v", seed, i, ra, rb)
			}
			if c != nil {
				if rc := c.Apply(data); rc.Durable != ra.Durable {
					t.Fatalf("seed %d entry %d: the restored replica decided %+v, want %+v", seed, i, rc.Durable, ra.Durable)
				}
			}
			if i == len(run)/2 {
				c = NewReplica(emptyMachine(t))
				if err := c.Restore(a.State()); err != nil {
					t.Fatalf("seed %d: restore: %v", seed, err)
				}
			}
		}
		if !bytes.Equal(a.State(), b.State()) || !bytes.Equal(a.State(), c.State()) {
			t.Fatalf("seed %d: replicas differ", seed)
		}
	}
}

// TestDurableSnapshotVersions: a state is written at the lowest version
// that holds it (2 while the durable store is empty, 4 after); a version-2
// state is read as an empty durable store, a version-3 one as buckets whose
// parameters are unknown (decided in those of their next command); the
// machine alone refuses a state with durable buckets; a cut state is
// refused.
func TestDurableSnapshotVersions(t *testing.T) {
	v2 := NewReplica(emptyMachine(t)).State()
	if v2[3] != 2 {
		t.Fatalf("a state with an empty durable store is written as version %d, want 2", v2[3])
	}
	h := NewReplica(emptyMachine(t))
	mustDecide(t, h.durable, durableCmd(1e9, "x", "acct"))
	v4 := h.State()
	if v4[3] != 4 {
		t.Fatalf("a state with durable buckets is written as version %d, want 4", v4[3])
	}
	g := NewReplica(emptyMachine(t))
	if err := g.Restore(v4); err != nil || !bytes.Equal(g.State(), v4) {
		t.Fatalf("a version-4 state: %v", err)
	}
	if err := g.Restore(v2); err != nil {
		t.Fatalf("a version-2 state: %v", err)
	}
	if n, r := g.DurableLen(); n != 0 || r != 0 {
		t.Fatalf("after restoring a version-2 state: %d buckets, %d requests", n, r)
	}
	if err := emptyMachine(t).RestoreState(v4); !errors.Is(err, ErrBadState) {
		t.Fatalf("Machine.RestoreState of a state with durable buckets: %v", err)
	}
	for cut := 1; cut < 12; cut++ {
		if err := NewReplica(emptyMachine(t)).Restore(v4[:len(v4)-cut]); !errors.Is(err, ErrBadState) {
			t.Fatalf("a state cut %d bytes short: %v", cut, err)
		}
	}

	// A version-3 state: the version-2 bytes, then the durable store with
	// buckets and no parameters. otp/u has spent 1 token of 5/min (its TAT
	// 12 s ahead, the interval it was written under not recorded).
	const now = int64(1_700_000_000) * sec
	v3 := append([]byte(nil), v2...)
	v3[3] = 3
	var w stateWriter
	w.int(now)
	w.uint(1)
	w.str("otp")
	w.str("u")
	w.int(now + 12*sec)
	w.uint(0) // requests
	v3 = append(v3, w.buf.Bytes()...)
	f := NewReplica(emptyMachine(t))
	if err := f.Restore(v3); err != nil {
		t.Fatalf("a version-3 state: %v", err)
	}
	if tat, ok := f.DurableTAT("otp", "u"); !ok || tat != now+12*sec {
		t.Fatalf("version-3 bucket: TAT %d, %v", tat, ok)
	}
	// Its parameters unknown, it is taken to be in its next command's: 4
	// tokens left at 5/min burst 5.
	if got := admitted(t, f.durable, now, otpRule, "u", 5); got != 4 {
		t.Fatalf("version-3 bucket: %d of 5 admitted, want 4", got)
	}
	if st := f.State(); st[3] != 4 {
		t.Fatalf("rewritten as version %d, want 4", st[3])
	}
}

// TestDurableSnapshotCarriesParameters: a snapshot taken after a bucket
// was written restores to the same bytes, and the restored replica converts
// the bucket at a later rule change exactly as the original does: the
// parameters each bucket is in, and when its rule's current ones appeared,
// travel in the snapshot.
func TestDurableSnapshotCarriesParameters(t *testing.T) {
	const t0 = int64(1_700_000_000) * sec
	a := NewReplica(emptyMachine(t))
	admitted(t, a.durable, t0, otpRule, "u", 3)
	raised := otpRule
	raised.Limit = 50
	admitted(t, a.durable, t0+sec, raised, "v", 1) // the change reaches the store: u is not converted yet
	st := a.State()
	b := NewReplica(emptyMachine(t))
	if err := b.Restore(st); err != nil || !bytes.Equal(b.State(), st) {
		t.Fatalf("restore: %v", err)
	}
	for i, f := range []*Replica{a, b} {
		// At the change u owed 35 s at 12 s a token, converted to 3.5 s at
		// 1.2 s a token; 3 s later it owes 0.5 s: 4 whole tokens. (Read
		// only then, the 32 s it owed under the old interval would be
		// 3.2 s: 2 tokens.)
		if got := admitted(t, f.durable, t0+4*sec, raised, "u", 5); got != 4 {
			t.Fatalf("replica %d: %d of 5 admitted, want 4", i, got)
		}
	}
	if !bytes.Equal(a.State(), b.State()) {
		t.Fatal("the restored replica's state differs")
	}
}

// durableSeeds are FuzzDecodeDurableEntry's seeds: durable entries, cut
// short, and one with every field at its bound.
func durableSeeds(t testing.TB) [][]byte {
	var seeds [][]byte
	for _, c := range []DurableCommand{
		durableCmd(1, "req", "acct"),
		{Now: 2, Rule: DurableRule{ID: "otp", Limit: 5, Window: 15 * time.Minute, Burst: 5}, Identity: "", Cost: 5},
		{Now: 3, RequestID: string(bytes.Repeat([]byte{'r'}, MaxRequestIDBytes)), Rule: trialRule,
			Identity: string(bytes.Repeat([]byte{0xff}, MaxDurableIdentityBytes)), Cost: 1},
		{Now: 4, Rule: trialRule, Identity: "\x00src\x00ip\x00198.51.100.7", Legacy: "198.51.100.7", KeyFormat: 2, Cost: 1},
	} {
		b, err := EncodeDurable(c)
		if err != nil {
			t.Fatal(err)
		}
		seeds = append(seeds, b, b[:len(b)-1], b[:len(b)/2])
	}
	return seeds
}

// FuzzDecodeDurableEntry: the decoder never panics on durable entries; what
// it accepts re-encodes to the same command; and the FSM applies any entry
// without panicking, leaving a state that snapshots and restores to the
// same bytes.
func FuzzDecodeDurableEntry(f *testing.F) {
	for _, s := range durableSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := DecodeLogEntry(b)
		if err != nil {
			if !errors.Is(err, ErrMalformedEntry) {
				t.Fatalf("error %v does not wrap ErrMalformedEntry", err)
			}
		} else if e.Durable != nil {
			b2, err := EncodeDurable(*e.Durable)
			if err != nil {
				t.Fatalf("decoded %+v does not encode: %v", *e.Durable, err)
			}
			e2, err := DecodeLogEntry(b2)
			if err != nil || e2.Durable == nil || *e2.Durable != *e.Durable {
				t.Fatalf("re-encoded %+v decodes to %+v, %v", *e.Durable, e2.Durable, err)
			}
		}
		fsm := NewReplica(emptyMachine(t))
		fsm.Apply(b)
		fsm.Apply(b) // a retry
		st := fsm.State()
		g := NewReplica(emptyMachine(t))
		if err := g.Restore(st); err != nil || !bytes.Equal(g.State(), st) {
			t.Fatalf("snapshot does not restore: %v", err)
		}
	})
}

// FuzzRestoreDurableState: the state decoder never panics on states with a
// durable store; a state it accepts re-encodes stably and decides on.
func FuzzRestoreDurableState(f *testing.F) {
	fsm := NewReplica(emptyMachine(f))
	for _, e := range randomDurableRun(rand.New(rand.NewPCG(1, 2)), 40, 1e9) {
		data, err := EncodeLogEntry(e)
		if err != nil {
			f.Fatal(err)
		}
		fsm.Apply(data)
	}
	st := fsm.State()
	f.Add(st)
	f.Add(st[:len(st)-1])
	f.Add(st[:len(st)*3/4])
	// A store switched to key format 2 (version 4, durable_legacy.go).
	if _, err := fsm.durable.Apply(DurableCommand{Now: 2e9, Rule: trialRule, Identity: "a", KeyFormat: 2, Cost: 1}); err != nil {
		f.Fatal(err)
	}
	st = fsm.State()
	f.Add(st)
	f.Add(st[:len(st)-1])
	f.Fuzz(func(t *testing.T, b []byte) {
		g := NewReplica(emptyMachine(t))
		if err := g.Restore(b); err != nil {
			return
		}
		once := g.State()
		h := NewReplica(emptyMachine(t))
		if err := h.Restore(once); err != nil || !bytes.Equal(h.State(), once) {
			t.Fatalf("re-encoding is not stable: %v", err)
		}
		if _, err := g.durable.Apply(durableCmd(1<<61, "again", "acct")); err != nil {
			t.Fatal(err)
		}
		g.durable.Tick(1 << 62)
	})
}

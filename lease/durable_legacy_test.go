package lease

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"
)

// ipTag is a later source's identity as weir tags it under key format 2.
const ipTag = "\x00src\x00ip\x00"

func keyedCmd(now int64, identity, legacy string, format uint32) DurableCommand {
	return DurableCommand{Now: now, Rule: trialRule, Identity: identity, Legacy: legacy, KeyFormat: format, Cost: 1}
}

// TestDurableLegacyTrial: a trial taken under key format 1 is not granted
// again when the identity's key changes with format 2, whichever command
// switches the store; an identity with no format-1 spend starts fresh.
func TestDurableLegacyTrial(t *testing.T) {
	t0 := int64(1e9)
	for _, first := range []string{"the later source itself", "another identity", "a first source"} {
		s := NewDurableStore()
		if d := mustDecide(t, s, keyedCmd(t0, "198.51.100.7", "", 0)); !d.Allowed {
			t.Fatalf("the format-1 trial was refused: %+v", d)
		}
		switch first {
		case "another identity":
			mustDecide(t, s, keyedCmd(t0+1, ipTag+"203.0.113.1", "203.0.113.1", 2))
		case "a first source":
			mustDecide(t, s, keyedCmd(t0+1, "acct-9", "", 2))
		}
		if !s.Switched() {
			if first != "the later source itself" {
				t.Fatalf("%s: a format-2 command did not switch the store", first)
			}
		}
		if d := mustDecide(t, s, keyedCmd(t0+2, ipTag+"198.51.100.7", "198.51.100.7", 2)); d.Allowed {
			t.Fatalf("%s first: the same client's trial was granted again under format 2: %+v", first, d)
		}
		if !s.Switched() {
			t.Fatalf("%s: the store did not switch", first)
		}
		if d := mustDecide(t, s, keyedCmd(t0+3, ipTag+"198.51.100.8", "198.51.100.8", 2)); !d.Allowed {
			t.Fatalf("%s first: a client with no trial before was refused: %+v", first, d)
		}
	}
}

// TestDurableLegacyNotShared: after the switch, a first-source value equal
// to a later source's (an API key equal to an IP) spends its own bucket
// only; the later source inherits only spend of format-1 commands. A
// format-1 command after the switch (a node that still speaks only format
// 1) updates the legacy state.
func TestDurableLegacyNotShared(t *testing.T) {
	t0 := int64(1e9)
	s := NewDurableStore()
	mustDecide(t, s, keyedCmd(t0, "acct-1", "", 2)) // switches an empty store
	if d := mustDecide(t, s, keyedCmd(t0+1, "198.51.100.7", "", 2)); !d.Allowed {
		t.Fatalf("the API key's trial was refused: %+v", d)
	}
	if d := mustDecide(t, s, keyedCmd(t0+2, ipTag+"198.51.100.7", "198.51.100.7", 2)); !d.Allowed {
		t.Fatalf("an API key equal to the IP spent the IP's trial: %+v", d)
	}
	if _, ok := s.LegacyTAT(trialRule.ID, "198.51.100.7"); ok {
		t.Fatalf("a format-2 command wrote legacy state")
	}
	mustDecide(t, s, keyedCmd(t0+3, "203.0.113.9", "", 0))
	if _, ok := s.LegacyTAT(trialRule.ID, "203.0.113.9"); !ok {
		t.Fatalf("a format-1 command after the switch left no legacy state")
	}
	if d := mustDecide(t, s, keyedCmd(t0+4, ipTag+"203.0.113.9", "203.0.113.9", 2)); d.Allowed {
		t.Fatalf("a trial taken through a format-1 node after the switch was granted again: %+v", d)
	}
	// Legacy state expires with its bucket.
	s.Tick(t0 + 3 + int64(30*day))
	if _, ok := s.LegacyTAT(trialRule.ID, "203.0.113.9"); ok || s.Len() != 0 {
		t.Fatalf("legacy state outlived its bucket: %d buckets", s.Len())
	}
}

// TestDurableLegacyRefuses: malformed legacy fields are refused.
func TestDurableLegacyRefuses(t *testing.T) {
	s := NewDurableStore()
	for _, c := range []DurableCommand{
		keyedCmd(1, ipTag+"x", "x", 1),
		keyedCmd(1, "x", "x", 2),
		keyedCmd(1, "x", string(bytes.Repeat([]byte{'a'}, MaxDurableIdentityBytes+1)), 2),
	} {
		if _, err := s.Apply(c); !errors.Is(err, ErrBadCommand) {
			t.Errorf("Apply(%+v) = %v, want ErrBadCommand", c, err)
		}
		if _, err := EncodeDurable(c); !errors.Is(err, ErrBadCommand) {
			t.Errorf("EncodeDurable(%+v) = %v, want ErrBadCommand", c, err)
		}
	}
	if s.Switched() || s.Len() != 0 {
		t.Fatal("a refused command changed the store")
	}
}

// TestDurableLegacySnapshots: a store that never saw a format-2 command is
// written as version 4, as before key formats; once switched, as version 5,
// with its legacy state, which restores to the same bytes and decisions;
// replicas applying a mixed run agree byte for byte.
func TestDurableLegacySnapshots(t *testing.T) {
	h := NewReplica(emptyMachine(t))
	mustDecide(t, h.durable, keyedCmd(1e9, "198.51.100.7", "", 0))
	if v := h.State()[3]; v != 4 {
		t.Fatalf("an unswitched store is written as version %d, want 4", v)
	}
	mustDecide(t, h.durable, keyedCmd(1e9+1, "acct", "", 2))
	v5 := h.State()
	if v5[3] != 5 {
		t.Fatalf("a switched store is written as version %d, want 5", v5[3])
	}
	g := NewReplica(emptyMachine(t))
	if err := g.Restore(v5); err != nil || !bytes.Equal(g.State(), v5) {
		t.Fatalf("a version-5 state does not restore: %v", err)
	}
	if d := mustDecide(t, g.durable, keyedCmd(1e9+2, ipTag+"198.51.100.7", "198.51.100.7", 2)); d.Allowed {
		t.Fatalf("the restored store granted a second trial: %+v", d)
	}
	for cut := 1; cut < 8; cut++ {
		if err := NewReplica(emptyMachine(t)).Restore(v5[:len(v5)-cut]); !errors.Is(err, ErrBadState) {
			t.Fatalf("a state cut %d bytes short: %v", cut, err)
		}
	}

	for seed := range uint64(10) {
		rng := rand.New(rand.NewPCG(seed, 9))
		run := randomDurableRun(rng, 200, 1e9)
		for i := range run {
			if c := run[i].Durable; c != nil && rng.IntN(2) == 0 {
				// Some commands come from format-2 nodes, some of them
				// for a later source's tagged identity.
				c.KeyFormat = 2
				if rng.IntN(2) == 0 {
					c.Legacy, c.Identity = c.Identity, ipTag+c.Identity
				}
			}
		}
		a, b := NewReplica(emptyMachine(t)), NewReplica(emptyMachine(t))
		var c *Replica
		for i, e := range run {
			data, err := EncodeLogEntry(e)
			if err != nil {
				t.Fatalf("seed %d entry %d: %v", seed, i, err)
			}
			ra := a.Apply(data)
			rb := b.Apply(data)
			if ra.Err != nil || ra.Durable != rb.Durable {
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

// TestDurableLegacyConverted: an inherited bucket is converted to the
// command's parameters like a held one: a trial spent under burst 1, the
// rule then raised to burst 2, leaves the tagged identity one more.
func TestDurableLegacyConverted(t *testing.T) {
	t0 := int64(1e9)
	s := NewDurableStore()
	mustDecide(t, s, keyedCmd(t0, "198.51.100.7", "", 0))
	raised := keyedCmd(t0+1, ipTag+"198.51.100.7", "198.51.100.7", 2)
	raised.Rule = DurableRule{ID: trialRule.ID, Limit: 2, Window: trialRule.Window, Burst: 2}
	if d := mustDecide(t, s, raised); !d.Allowed {
		t.Fatalf("the raised burst's extra token was refused: %+v", d)
	}
	raised.Now++
	if d := mustDecide(t, s, raised); d.Allowed {
		t.Fatalf("the token spent under format 1 was granted again: %+v", d)
	}
}

package shell

import (
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir/internal/leakcheck"
)

// TestMembershipCloseWaits checks that Close and Leave return only when every
// goroutine memberlist started has stopped: one look right after they return,
// with no retry window (leakcheck, not goleak, whose retries would hide a
// probe or a stream handler that ends a few milliseconds later). Three nodes
// gossip for a while, so that probes, push/pulls and stream handlers are in
// flight when they stop; one leaves, one crashes, and the last closes alone.
func TestMembershipCloseWaits(t *testing.T) {
	before := leakcheck.Snapshot()
	var ms []*Membership
	for i, name := range []string{"a", "b", "c"} {
		cfg := MembershipConfig{Name: name, Region: "eu", RPCAddr: name + ".rpc:7000",
			Label: testLabel(t), Profile: ProfileLocal}
		if i > 0 {
			cfg.Join = []string{ms[0].GossipAddr()}
		}
		m, err := StartMembership(cfg)
		if err != nil {
			t.Fatalf("StartMembership(%s): %v", name, err)
		}
		t.Cleanup(func() { _ = m.Close() })
		ms = append(ms, m)
	}
	deadline := time.Now().Add(waitLimit)
	for _, m := range ms {
		for len(m.Members()) < 3 {
			if time.Now().After(deadline) {
				t.Fatalf("%s sees %s, want a,b,c", m.LocalName(), memberNames(m.Members()))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	time.Sleep(300 * time.Millisecond) // a few probe and gossip rounds

	check := func(what string) {
		t.Helper()
		if left := leakcheck.Left(before); len(left) > 0 {
			t.Fatalf("%d goroutines still running right after %s:\n\n%s", len(left), what, strings.Join(left, "\n\n"))
		}
	}
	stop := func(what string, f func() error) {
		t.Helper()
		start := time.Now()
		if err := f(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		t.Logf("%s returned in %v", what, time.Since(start).Round(time.Millisecond))
	}
	stop("Leave(c)", func() error { return ms[2].Leave(2 * time.Second) })
	stop("Close(b)", ms[1].Close)
	// a still runs; it probes b, which no longer answers.
	time.Sleep(150 * time.Millisecond)
	stop("Close(a)", ms[0].Close)
	check("Leave(c), Close(b) and Close(a)")
}

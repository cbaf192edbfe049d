// Package leakcheck finds goroutines left behind, in one look, with no retry
// window.
//
// go.uber.org/goleak retries for up to about two seconds before it reports,
// which hides goroutines that end by themselves a little after the call that
// should have stopped them (a Close that does not wait). Tests that check that
// a Close returns only once everything it started has stopped take a Snapshot
// before starting, and call Left right after Close returns:
//
//	before := leakcheck.Snapshot()
//	n := start()
//	n.Close()
//	if left := leakcheck.Left(before); len(left) > 0 {
//		t.Fatalf("goroutines left after Close:\n%s", strings.Join(left, "\n\n"))
//	}
//
// Goroutines are told apart by their ids, so Left reports every goroutine
// started after the Snapshot and still running, except the calling one and
// those of the testing package and the runtime's signal and trace helpers.
// The test must stop its own goroutines before it calls Left.
package leakcheck

import (
	"bytes"
	"runtime"
	"strconv"
	"strings"
)

// Before is a set of goroutine ids, taken by Snapshot.
type Before map[uint64]bool

// Snapshot returns the ids of the goroutines running now.
func Snapshot() Before {
	ids := make(Before)
	for _, g := range all() {
		ids[g.id] = true
	}
	return ids
}

// Left returns the stack of every goroutine running now that is not in
// before, not the caller, and not one of the testing package's or runtime's
// helpers. It looks once.
func Left(before Before) []string {
	gs := all()
	if len(gs) == 0 {
		return nil
	}
	self := gs[0].id // runtime.Stack lists the caller first
	var left []string
	for _, g := range gs {
		if g.id == self || before[g.id] || ignored(g.stack) {
			continue
		}
		left = append(left, g.stack)
	}
	return left
}

type goroutine struct {
	id    uint64
	stack string
}

// all returns every goroutine's id and stack, the caller's first.
func all() []goroutine {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var gs []goroutine
	for _, block := range bytes.Split(buf, []byte("\n\n")) {
		s := string(bytes.TrimSpace(block))
		// "goroutine 17 [chan receive]:"
		rest, ok := strings.CutPrefix(s, "goroutine ")
		if !ok {
			continue
		}
		idText, _, _ := strings.Cut(rest, " ")
		id, err := strconv.ParseUint(idText, 10, 64)
		if err != nil {
			continue
		}
		gs = append(gs, goroutine{id: id, stack: s})
	}
	return gs
}

// ignored reports goroutines that belong to the test binary or the runtime,
// not to the code under test: as goleak's default filters do.
func ignored(stack string) bool {
	_, body, _ := strings.Cut(stack, "\n")
	top, _, _ := strings.Cut(body, "\n")
	for _, fn := range []string{
		"testing.RunTests", "testing.(*T).Run", "testing.(*T).Parallel", "testing.tRunner",
		"testing.runFuzzing", "testing.(*F).Fuzz", "testing.(*M).",
		"os/signal.signal_recv", "os/signal.loop", "runtime.ensureSigM", "runtime/trace.",
		"runtime.ReadTrace",
	} {
		if strings.HasPrefix(top, fn) {
			return true
		}
	}
	// A test goroutine parked in the testing package (waiting for its
	// subtests, or for a parallel test's turn).
	return strings.Contains(stack, "\ntesting.tRunner(") && strings.HasPrefix(top, "testing.")
}

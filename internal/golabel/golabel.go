// Package golabel waits for goroutines that a library starts and does not
// wait for itself.
//
// Neither memberlist nor gRPC nor hashicorp/raft's network transport waits
// for all of its goroutines when it shuts down: memberlist's Shutdown
// returns while a probe waits out its interval; a gRPC ClientConn's Close
// may return while a connect attempt it cancelled is still returning; raft's
// transport leaves the handlers of accepted connections reading. weir
// starts each of them inside Do with a label value of its own, which every
// goroutine started there inherits (and those goroutines' children), and
// its Close, after shutting the library down, calls Wait: it returns once
// the goroutine profile shows no goroutine with that value.
//
//	label := golabel.New("memberlist")
//	golabel.Do(label, func() { ml, err = memberlist.Create(cfg) })
//	...
//	ml.Shutdown()
//	golabel.Wait(label, time.Second)
//
// Wait reads the whole goroutine profile (a stop of the world per look), so
// it belongs on a Close path, not a request path.
package golabel

import (
	"bytes"
	"context"
	"fmt"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// key is the pprof label key; its value names one user (a Membership, a
// transport, a lease group) in the process.
const key = "weir.goroutines"

var labelSeq atomic.Uint64

// New returns a label value no other user in the process has, named after
// kind.
func New(kind string) string {
	return kind + "-" + strconv.FormatUint(labelSeq.Add(1), 10)
}

// Do runs f with the label value set, so that every goroutine f starts
// carries it, and so do their own children.
func Do(value string, f func()) {
	pprof.Do(context.Background(), pprof.Labels(key, value), func(context.Context) { f() })
}

// Count returns how many goroutines run with the label value.
func Count(value string) int {
	var buf bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&buf, 1); err != nil {
		return 0
	}
	// Groups of goroutines with one stack and one label set:
	//	3 @ 0x... 0x...
	//	# labels: {"weir.goroutines":"memberlist-7"}
	want := fmt.Sprintf("%q:%q", key, value)
	n, count := 0, 0
	for line := range strings.Lines(buf.String()) {
		if head, _, ok := strings.Cut(line, " @ "); ok && !strings.HasPrefix(line, "#") {
			count, _ = strconv.Atoi(head)
			continue
		}
		if labels, ok := strings.CutPrefix(line, "# labels: "); ok && strings.Contains(labels, want) {
			n += count
		}
	}
	return n
}

// Wait waits until no goroutine runs with the label value, or limit passes;
// it returns how many still run (0 unless it gave up).
func Wait(value string, limit time.Duration) int {
	deadline := time.Now().Add(limit)
	pause := 100 * time.Microsecond
	for {
		n := Count(value)
		if n == 0 || time.Now().After(deadline) {
			return n
		}
		time.Sleep(pause)
		pause = min(2*pause, 10*time.Millisecond)
	}
}

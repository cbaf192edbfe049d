package shell

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

// Neither memberlist nor gRPC waits for all of its goroutines when it shuts
// down: memberlist's Shutdown closes a channel and returns while a probe
// waits out its probe interval, a stream handler reads or a push/pull
// merges; a gRPC ClientConn's Close may return while a connect attempt it
// cancelled is still returning. Membership and GRPCTransport start them
// under a pprof label of their own, which every goroutine they start
// inherits (and those goroutines' children), and their Close waits until the
// goroutine profile shows none with that label.

// goroutineLabel is the pprof label key; its value names one Membership or
// one GRPCTransport of the process.
const goroutineLabel = "weir.shell"

var labelSeq atomic.Uint64

// newGoroutineLabel returns a label value no other user in the process has.
func newGoroutineLabel(kind string) string {
	return kind + "-" + strconv.FormatUint(labelSeq.Add(1), 10)
}

// startLabelled runs f with the label set, so that every goroutine f starts
// carries it.
func startLabelled(value string, f func()) {
	pprof.Do(context.Background(), pprof.Labels(goroutineLabel, value), func(context.Context) { f() })
}

// labelled counts the goroutines running with the label value.
func labelled(value string) int {
	var buf bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&buf, 1); err != nil {
		return 0
	}
	// Groups of goroutines with one stack and one label set:
	//	3 @ 0x... 0x...
	//	# labels: {"weir.shell":"memberlist-7"}
	want := fmt.Sprintf("%q:%q", goroutineLabel, value)
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

// waitLabelled waits until no goroutine runs with the label value, or limit
// passes; it returns how many still run.
func waitLabelled(value string, limit time.Duration) int {
	deadline := time.Now().Add(limit)
	pause := 100 * time.Microsecond
	for {
		n := labelled(value)
		if n == 0 || time.Now().After(deadline) {
			return n
		}
		time.Sleep(pause)
		pause = min(2*pause, 10*time.Millisecond)
	}
}

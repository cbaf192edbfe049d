package weir

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weir-dev/weir/internal/leakcheck"
)

// TestNodeCloseWaits checks that Node.Close returns only when everything the
// node started has stopped (docs/design.md, "Real parts, real tests"): three real
// nodes decide shared and exact requests for each other, so that peer
// exchanges, memberlist probes, push/pulls and stream handlers are in flight;
// then one crashes and the others close, and right after the last Close one
// look (leakcheck: no retry window, unlike goleak) must find no goroutine
// that was not running before the nodes started.
func TestNodeCloseWaits(t *testing.T) {
	before := leakcheck.Snapshot()
	c := startAccCluster(t, "close-waits", 3, 3)

	ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
	defer cancel()
	var wg sync.WaitGroup
	for i := range 3 {
		node := c.nodes[i]
		for _, path := range []string{"/shared", "/exact"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := 0; ctx.Err() == nil; k++ {
					req := Request{Method: "GET", Path: path, Header: http.Header{"X-Api-Key": {fmt.Sprintf("id-%d", k%16)}}}
					if d := node.Allow(ctx, req); d.Err != nil && ctx.Err() == nil {
						t.Errorf("gw-%d %s: %v", i, path, d.Err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()

	stop := func(what string, f func()) {
		start := time.Now()
		f()
		t.Logf("%s returned in %v", what, time.Since(start).Round(time.Millisecond))
	}
	stop("crash of gw-2", func() { c.crash(2) })
	stop("Close of gw-1", func() { c.nodes[1].Close(); c.nodes[1] = nil })
	time.Sleep(150 * time.Millisecond) // gw-0 probes the nodes that went away
	stop("Close of gw-0", func() { c.nodes[0].Close(); c.nodes[0] = nil })
	if left := leakcheck.Left(before); len(left) > 0 {
		t.Fatalf("%d goroutines still running right after the last Close:\n\n%s", len(left), strings.Join(left, "\n\n"))
	}
}

package weir_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir/internal/leakcheck"
)

// TestNodeCloseWaitsLease is TestNodeCloseWaits with the lease group: three
// gateways that are its voters (real Raft on raft-boltdb, lease RPC,
// memberlist, peer gRPC) and a gateway that is its client decide durable
// requests; then the client and every voter close, the leader last, and
// right after the last Close one look (leakcheck: no retry window) must
// find no goroutine that was not running before the nodes started.
func TestNodeCloseWaitsLease(t *testing.T) {
	before := leakcheck.Snapshot()
	g := startDurableGroup(t, 3)
	client := g.client()
	for i := range 4 {
		trials(t, g.gateways(client), fmt.Sprintf("close-%d", i), 2)
	}
	start := time.Now()
	client.Close()
	leader := g.leader()
	for _, name := range g.names {
		if name != leader {
			g.stop(name)
		}
	}
	g.stop(leader)
	t.Logf("the client and three voters closed in %v", time.Since(start).Round(time.Millisecond))
	if left := leakcheck.Left(before); len(left) > 0 {
		t.Fatalf("%d goroutines still running right after the last Close:\n\n%s", len(left), strings.Join(left, "\n\n"))
	}
}

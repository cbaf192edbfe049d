package weir_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLayout enforces docs/design.md's one rule at the import level:
// bucket/ imports only the standard library (and its tables, internal
// packages that import only the standard library), and neither bucket/ nor quota/
// nor envoyconf/ (rules as data, from Envoy's format) reaches the cluster,
// the lease group, memberlist, raft or gRPC.
func TestLayout(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("the go command is not on PATH")
	}
	forbidden := []string{
		"github.com/weir-dev/weir/cluster",
		"github.com/weir-dev/weir/lease",
		"github.com/hashicorp/memberlist",
		"github.com/hashicorp/raft",
		"google.golang.org/grpc",
	}
	for _, pkg := range []string{"./bucket", "./quota", "./envoyconf"} {
		deps := goList(t, pkg)
		for _, d := range deps {
			for _, f := range forbidden {
				if d == f || strings.HasPrefix(d, f+"/") {
					t.Errorf("%s imports %s (directly or not); docs/design.md forbids it", pkg, d)
				}
			}
		}
	}
	// bucket/'s tables are packages of their own (internal/keytable,
	// internal/atomictable), which import only the standard library too.
	tables := map[string]bool{
		"github.com/weir-dev/weir/internal/keytable":    true,
		"github.com/weir-dev/weir/internal/atomictable": true,
	}
	for _, d := range goList(t, "./bucket") {
		if d == "github.com/weir-dev/weir/bucket" || tables[d] {
			continue
		}
		if !isStd(t, d) {
			t.Errorf("bucket/ reaches %s: bucket/ may import only the standard library and its tables", d)
		}
	}
}

// TestLayoutCoresAndShells: the cores the simulator runs stay apart from
// their shells. The cluster core and the request policy reach no shell
// (cluster/shell, memberlist, gRPC); the request policy imports only the
// standard library; the simulator runs the cores, never the cluster's
// shell or memberlist (it models the network and membership itself).
func TestLayoutCoresAndShells(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("the go command is not on PATH")
	}
	shells := []string{"github.com/weir-dev/weir/cluster/shell", "github.com/hashicorp/memberlist", "google.golang.org/grpc"}
	for _, pkg := range []string{"./cluster", "./internal/policy"} {
		for _, d := range goList(t, pkg) {
			for _, f := range shells {
				if d == f || strings.HasPrefix(d, f+"/") {
					t.Errorf("%s reaches %s: a core leaves I/O to its shell", pkg, d)
				}
			}
		}
	}
	for _, d := range goList(t, "./internal/policy") {
		if d != "github.com/weir-dev/weir/internal/policy" && !isStd(t, d) {
			t.Errorf("internal/policy reaches %s: the request policy imports only the standard library", d)
		}
	}
	for _, d := range goList(t, "./sim/...") {
		for _, f := range shells[:2] {
			if d == f || strings.HasPrefix(d, f+"/") {
				t.Errorf("sim/ reaches %s: the simulator runs the cores and models the network and membership", d)
			}
		}
	}
}

func goList(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", pkg).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	return strings.Fields(string(out))
}

var stdCache map[string]bool

func isStd(t *testing.T, pkg string) bool {
	t.Helper()
	if stdCache == nil {
		out, err := exec.Command("go", "list", "std").Output()
		if err != nil {
			t.Fatalf("go list std: %v", err)
		}
		stdCache = map[string]bool{}
		for _, p := range strings.Fields(string(out)) {
			stdCache[p] = true
		}
	}
	return stdCache[pkg]
}

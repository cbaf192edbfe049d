package weir_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLayout enforces DESIGN.md's one structural rule at the import level:
// bucket/ imports only the standard library, and neither bucket/ nor quota/
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
					t.Errorf("%s imports %s (directly or not); DESIGN.md forbids it", pkg, d)
				}
			}
		}
	}
	for _, d := range goList(t, "./bucket") {
		if d == "github.com/weir-dev/weir/bucket" {
			continue
		}
		if !isStd(t, d) {
			t.Errorf("bucket/ reaches %s: bucket/ may import only the standard library", d)
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

package weir_test

import (
	"os/exec"
	"reflect"
	"strings"
	"testing"

	"github.com/weir-dev/weir"
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
// (cluster/shell, memberlist, gRPC); the lease core reaches neither the
// Raft group (lease/raftgroup, hashicorp/raft), gRPC (its log's messages,
// leasepb, hold no service) nor the cluster's shell; the
// request policy imports only the standard library; the simulator runs the
// cores, never a shell, memberlist or Raft (it models the network,
// membership and the Raft log itself).
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
	raftShells := []string{"github.com/weir-dev/weir/lease/raftgroup", "github.com/hashicorp/raft",
		"github.com/hashicorp/raft-boltdb", "google.golang.org/grpc", "github.com/weir-dev/weir/cluster/shell",
		"github.com/hashicorp/memberlist"}
	for _, d := range goList(t, "./lease") {
		for _, f := range raftShells {
			if d == f || strings.HasPrefix(d, f+"/") {
				t.Errorf("lease/ reaches %s: the lease core leaves Raft, gRPC, sockets and locks to lease/raftgroup", d)
			}
		}
	}
	for _, d := range goList(t, "./internal/policy") {
		if d != "github.com/weir-dev/weir/internal/policy" && !isStd(t, d) {
			t.Errorf("internal/policy reaches %s: the request policy imports only the standard library", d)
		}
	}
	for _, d := range goList(t, "./sim/...") {
		for _, f := range append(shells[:2:2], raftShells[:3]...) {
			if d == f || strings.HasPrefix(d, f+"/") {
				t.Errorf("sim/ reaches %s: the simulator runs the cores and models the network, membership and Raft", d)
			}
		}
	}
}

// TestLayoutOperatorViews: the operator's views (package ops) read a node
// through internal/nodeops, which only weir, ops and the demo import and
// which imports nothing; weir itself never reaches ops.
func TestLayoutOperatorViews(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("the go command is not on PATH")
	}
	const nodeops = "github.com/weir-dev/weir/internal/nodeops"
	for _, d := range goList(t, ".") {
		if d == "github.com/weir-dev/weir/ops" {
			t.Errorf("package weir reaches %s: the operator's views are built on the node, not in it", d)
		}
	}
	if deps := goList(t, "./internal/nodeops"); len(deps) != 1 || deps[0] != nodeops {
		t.Errorf("internal/nodeops imports %v; it is a passage and imports nothing", deps[:len(deps)-1])
	}
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	allowed := map[string]bool{"github.com/weir-dev/weir": true, "github.com/weir-dev/weir/ops": true,
		"github.com/weir-dev/weir/cmd/demo": true}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		for _, imp := range f[1:] {
			if imp == nodeops && !allowed[f[0]] {
				t.Errorf("%s imports internal/nodeops: only weir, ops and the demo pass through it", f[0])
			}
		}
	}
}

// TestNodeAPI: weir.Node keeps what a gateway and weir's adapters call,
// at most 15 methods, none of which takes or returns a type of the
// cluster or lease packages (docs/design.md).
func TestNodeAPI(t *testing.T) {
	typ := reflect.TypeFor[*weir.Node]()
	if typ.NumMethod() > 15 {
		t.Errorf("weir.Node has %d methods; the node's API keeps at most 15", typ.NumMethod())
	}
	inner := func(x reflect.Type) bool {
		for x.Kind() == reflect.Pointer || x.Kind() == reflect.Slice || x.Kind() == reflect.Map || x.Kind() == reflect.Array {
			x = x.Elem()
		}
		p := x.PkgPath()
		return strings.HasPrefix(p, "github.com/weir-dev/weir/cluster") || strings.HasPrefix(p, "github.com/weir-dev/weir/lease")
	}
	for i := range typ.NumMethod() {
		m := typ.Method(i)
		for j := range m.Type.NumIn() {
			if inner(m.Type.In(j)) {
				t.Errorf("Node.%s takes %s", m.Name, m.Type.In(j))
			}
		}
		for j := range m.Type.NumOut() {
			if inner(m.Type.Out(j)) {
				t.Errorf("Node.%s returns %s", m.Name, m.Type.Out(j))
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

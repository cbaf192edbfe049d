package weir_test

import (
	"bufio"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// Limits of the code's shape (docs/design.md): a file a reader can hold,
// a function a reader can follow.
const (
	maxFileLines = 1000
	maxFuncLines = 120
)

// longFuncsAllowed are the functions exempt from maxFuncLines, by file and
// name (none).
var longFuncsAllowed = map[string]bool{}

// goFiles returns the Go files of the repository (nested modules
// included), relative to its root and with forward slashes, skipping
// testdata and generated files.
func goFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); n == "testdata" || (strings.HasPrefix(n, ".") && n != ".") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(p, ".go") && !generated(t, p) {
			files = append(files, filepath.ToSlash(p))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// generated reports whether the Go file at p says it is generated (the
// "Code generated ... DO NOT EDIT." line of go generate's convention).
func generated(t *testing.T, p string) bool {
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "// Code generated ") && strings.HasSuffix(line, " DO NOT EDIT.") {
			return true
		}
		if strings.HasPrefix(line, "package ") {
			return false
		}
	}
	return false
}

// TestFileAndFunctionSizes: no Go file that is not generated is over
// maxFileLines lines, and no function outside tests (and the demo's
// summary) is over maxFuncLines.
func TestFileAndFunctionSizes(t *testing.T) {
	for _, p := range goFiles(t) {
		src, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(src), "\n"); n > maxFileLines {
			t.Errorf("%s: %d lines, more than %d: split it by role", p, n, maxFileLines)
		}
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, p, src, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok {
				continue
			}
			n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1
			if n > maxFuncLines && !longFuncsAllowed[p+" "+fd.Name.Name] {
				t.Errorf("%s: func %s is %d lines, more than %d", p, fd.Name.Name, n, maxFuncLines)
			}
		}
	}
}

// pureCore is a directory of a deterministic core, the code the simulator
// runs: time is passed in and nothing starts a goroutine.
type pureCore struct {
	dir string
	// shell lists the files of dir that are the I/O shell around its core
	// (they may read the clock, lock and start goroutines).
	shell []string
	// noShellImports: the core's files import none of shellImports either
	// (bucket's stores are shared by a node's goroutines and lock).
	noShellImports bool
}

var pureCores = []pureCore{
	{dir: "bucket"},
	// The cluster core: its shell is cluster/shell.
	{dir: "cluster", noShellImports: true},
	// The lease core (machine, holder, allocation, regional, durable and
	// rule stores, codec, snapshots, Replica.Apply): its shell, the Raft
	// group, is lease/raftgroup.
	{dir: "lease", noShellImports: true},
	// Rules as data; reload.go is the file watcher's shell.
	{dir: "quota", shell: []string{"reload.go"}},
	// The request policy.
	{dir: "internal/policy", noShellImports: true},
	// The hot-path tables of bucket/ and cluster/.
	{dir: "internal/keytable"},
	{dir: "internal/atomictable"},
	{dir: "internal/strtable"},
	{dir: "internal/posindex"},
}

// clockReads are the calls a core must not make.
var clockReads = map[string]bool{"time.Now": true, "time.Since": true, "time.Until": true}

// shellImports are the packages a core file must not import (with the
// packages under them): locks, sockets, cancellation, global randomness,
// gRPC, memberlist and Raft belong to the shell.
var shellImports = []string{"sync", "net", "context", "math/rand",
	"google.golang.org/grpc", "github.com/hashicorp/memberlist",
	"github.com/hashicorp/raft", "github.com/hashicorp/raft-boltdb"}

// TestCoresArePure: the core files of pureCores read no clock (time.Now,
// time.Since, time.Until) and start no goroutine, and those that must not
// import none of shellImports; their tests may.
func TestCoresArePure(t *testing.T) {
	for _, c := range pureCores {
		entries, err := os.ReadDir(c.dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			name := e.Name()
			if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") || slices.Contains(c.shell, name) {
				continue
			}
			checkPure(t, c.dir+"/"+name, c.noShellImports)
		}
	}
}

// checkPure reports the clock reads and goroutines of the Go file p, and
// with imports its shell imports.
func checkPure(t *testing.T, p string, imports bool) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	for _, im := range f.Imports {
		path, _ := strconv.Unquote(im.Path.Value)
		for _, bad := range shellImports {
			if imports && (path == bad || strings.HasPrefix(path, bad+"/")) {
				t.Errorf("%s imports %s: a core takes time and randomness as arguments and leaves concurrency and I/O to its shell", p, path)
			}
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.GoStmt:
			t.Errorf("%s: a go statement at %s: a core starts no goroutine", p, fset.Position(n.Pos()))
		case *ast.SelectorExpr:
			if x, ok := n.X.(*ast.Ident); ok && clockReads[x.Name+"."+n.Sel.Name] {
				t.Errorf("%s: %s.%s at %s: a core is given the time", p, x.Name, n.Sel.Name, fset.Position(n.Pos()))
			}
		}
		return true
	})
}

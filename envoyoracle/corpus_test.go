package envoyoracle

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
)

var (
	modOnce sync.Once
	modDir  string
	modErr  error
)

// envoyModuleDir is the envoyproxy/ratelimit module's directory in the module
// cache (its files, as published at the version in go.mod).
func envoyModuleDir(t *testing.T) string {
	t.Helper()
	modOnce.Do(func() {
		out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/envoyproxy/ratelimit").Output()
		if err != nil {
			modErr = fmt.Errorf("go list -m github.com/envoyproxy/ratelimit: %v", err)
			return
		}
		modDir = strings.TrimSpace(string(out))
		if modDir == "" {
			modErr = fmt.Errorf("github.com/envoyproxy/ratelimit is not in the module cache (go mod download)")
		}
	})
	if modErr != nil {
		t.Fatal(modErr)
	}
	return modDir
}

// corpusDirs are the folders of the envoyproxy/ratelimit module that hold
// descriptor files: the example, the config loader's tests, and the
// integration test's runtime directory (config/ is what its service loads;
// reload.yaml is copied in by the reload test).
var corpusDirs = []string{
	"examples/ratelimit/config",
	"test/config",
	"test/integration/runtime/current/ratelimit",
	"test/integration/runtime/current/ratelimit/config",
}

// corpusCase is one load: one file, or several files loaded together as
// envoyproxy/ratelimit loads a config directory.
type corpusCase struct {
	name  string   // the files, relative to the module
	files []string // absolute
	merge bool     // MERGE_DOMAIN_CONFIG for envoyproxy/ratelimit
}

func corpus(t *testing.T) []corpusCase {
	t.Helper()
	root := envoyModuleDir(t)
	var cases []corpusCase
	for _, d := range corpusDirs {
		files, err := filepath.Glob(filepath.Join(root, d, "*.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		sort.Strings(files)
		for _, f := range files {
			rel, _ := filepath.Rel(root, f)
			cases = append(cases, corpusCase{name: rel, files: []string{f}})
		}
	}
	// Directories loaded whole, as the service loads them.
	rt := filepath.Join(root, "test/integration/runtime/current/ratelimit/config")
	all, _ := filepath.Glob(filepath.Join(rt, "*.yaml"))
	sort.Strings(all)
	cases = append(cases, corpusCase{name: "test/integration/runtime/current/ratelimit/config/ (together)", files: all})
	m1, m2 := filepath.Join(root, "test/config/merge_domain_key1.yaml"), filepath.Join(root, "test/config/merge_domain_key2.yaml")
	cases = append(cases,
		corpusCase{name: "test/config/merge_domain_key{1,2}.yaml (together, MERGE_DOMAIN_CONFIG=false)", files: []string{m1, m2}},
		corpusCase{name: "test/config/merge_domain_key{1,2}.yaml (together, MERGE_DOMAIN_CONFIG=true)", files: []string{m1, m2}, merge: true})
	return cases
}

// outcome is accept or refuse.
func outcome(err error) string {
	if err == nil {
		return "accept"
	}
	return "refuse"
}

// knownConfigDifferences are the loads where weir's outcome differs from
// envoyproxy/ratelimit's, with the cause. The test fails when this table is
// not exactly the set of differences: a new difference, or a fixed one.
var knownConfigDifferences = map[string]string{}

// TestConfigCorpus loads every descriptor file of envoyproxy/ratelimit's
// module into envoyproxy/ratelimit's own config loader and into
// `weir serve --check` (in fidelity mode, with merge_domains where
// envoyproxy/ratelimit has MERGE_DOMAIN_CONFIG=true), and compares accept or
// refuse.
func TestConfigCorpus(t *testing.T) {
	cases := corpus(t)
	found := map[string]bool{}
	same := 0
	for _, c := range cases {
		eErr := envoyLoads(c.files, c.merge)
		wErr := weirChecks(t, c.files, c.merge)
		e, w := outcome(eErr), outcome(wErr)
		line := fmt.Sprintf("%-80s envoy %-6s weir %-6s", c.name, e, w)
		if e == w {
			same++
			t.Log(line)
		} else {
			found[c.name] = true
			t.Logf("%s  DIFFERENT\n    envoy: %v\n    weir:  %v", line, eErr, firstLines(wErr, 3))
		}
		if cause, known := knownConfigDifferences[c.name]; known && e == w {
			t.Errorf("%s: known difference (%s) is gone: both %s; drop it from knownConfigDifferences", c.name, cause, e)
		} else if !known && e != w {
			t.Errorf("%s: new difference: envoyproxy/ratelimit %s, weir %s", c.name, e, w)
		}
	}
	for name := range knownConfigDifferences {
		if !containsCase(cases, name) {
			t.Errorf("knownConfigDifferences names %q, which is not in the corpus", name)
		}
	}
	t.Logf("%d loads: %d the same outcome, %d different (all known: %v)", len(cases), same, len(found), !t.Failed())
}

func containsCase(cases []corpusCase, name string) bool {
	for _, c := range cases {
		if c.name == name {
			return true
		}
	}
	return false
}

func firstLines(err error, n int) string {
	if err == nil {
		return "<nil>"
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, " | ")
}

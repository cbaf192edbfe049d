package yamlwalk

import (
	"errors"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestMapping: every kind of key problem is reported once, at the line and
// path its parsers print, and the known keys reach field in order.
func TestMapping(t *testing.T) {
	var doc yaml.Node
	src := "a: 1\nb: &x 2\na: 3\nzz: 4\n? [k]\n: 5\nc: *x\n"
	if err := yaml.Unmarshal([]byte(src), &doc); err != nil {
		t.Fatal(err)
	}
	var got []string
	ok := Mapping(doc.Content[0], "r", []string{"a", "b", "c"},
		func(n *yaml.Node, line int, field, msg string) {
			got = append(got, field+"@"+strings.Repeat("L", line)+": "+msg)
		},
		func(key string, k *yaml.Node, fpath string, v *yaml.Node) {
			r, why := Resolve(v)
			if r == nil {
				t.Fatalf("%s: %s", fpath, why)
			}
			got = append(got, fpath+"="+r.Value)
		})
	want := []string{`r.a=1`, `r.b=2`, `r.a@LLL: duplicate field "a" (first at line 1)`,
		`r.zz@LLLL: unknown field "zz" (want one of a, b, c)`, `r@: field names must be plain strings, got a list`, `r.c=2`}
	if !ok || strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if Mapping(&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null"}, "r", nil,
		func(_ *yaml.Node, _ int, _, msg string) { got = append(got, msg) }, nil) || got[len(got)-1] != "expected a mapping, got null" {
		t.Fatalf("a null node: %v", got[len(got)-1])
	}
}

// TestResolveAndSyntaxError: an alias to nothing is named; a yaml error's
// line is split off.
func TestResolveAndSyntaxError(t *testing.T) {
	if n, why := Resolve(&yaml.Node{Kind: yaml.AliasNode}); n != nil || why != "alias to nothing" {
		t.Fatalf("Resolve = %v, %q", n, why)
	}
	if line, msg := SyntaxError(errors.New("yaml: line 7: did not find expected key")); line != 7 || msg != "did not find expected key" {
		t.Fatalf("SyntaxError = %d, %q", line, msg)
	}
	if line, msg := SyntaxError(errors.New("yaml: control characters are not allowed")); line != 0 || msg != "control characters are not allowed" {
		t.Fatalf("SyntaxError = %d, %q", line, msg)
	}
}

// Package yamlwalk is the strict walk over a YAML node tree that weir's
// file formats share (quota's rules file, envoyconf's descriptor files):
// mappings with known keys only, no duplicate, merge or non-scalar keys,
// bounded alias chains, and "expected X, got Y" descriptions. Each parser
// keeps its own error type and line policy; this package only finds the
// problems and says what they are.
package yamlwalk

import (
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// IsNull reports whether n is a null scalar.
func IsNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// Describe names what a node is, for "expected X, got Y" messages.
func Describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if IsNull(n) {
			return "null"
		}
		return strconv.Quote(n.Value)
	case yaml.AliasNode:
		return "an alias"
	}
	return "an unexpected node"
}

// Resolve follows an alias chain. It returns the node it ends at, or nil
// and why: a chain longer than 100 links, or an alias to nothing.
func Resolve(n *yaml.Node) (*yaml.Node, string) {
	for i := 0; n != nil && n.Kind == yaml.AliasNode; i++ {
		if i > 100 {
			return nil, "alias chain too long"
		}
		n = n.Alias
	}
	if n == nil {
		return nil, "alias to nothing"
	}
	return n, ""
}

var lineRE = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// SyntaxError splits a yaml.v3 decoding error into its line (0 when it
// names none) and its message without the "yaml: " prefix.
func SyntaxError(err error) (line int, msg string) {
	msg = err.Error()
	if m := lineRE.FindStringSubmatch(msg); m != nil {
		line, _ = strconv.Atoi(m[1])
		return line, m[2]
	}
	return 0, strings.TrimPrefix(msg, "yaml: ")
}

// Mapping walks the mapping n at path. It reports through bad, with the
// node concerned and the field path: n itself when it is not a mapping
// (then it returns false), a non-scalar key and a merge key (at path, line
// 0: the parser's own line for path), and a repeated or unknown key (at
// the key's path, line: the key's line). For every other key it calls
// field with the key, its node, its path and its value, not resolved.
func Mapping(n *yaml.Node, path string, known []string,
	bad func(n *yaml.Node, line int, field, msg string),
	field func(key string, k *yaml.Node, fpath string, v *yaml.Node)) bool {
	if n.Kind != yaml.MappingNode {
		bad(n, 0, path, "expected a mapping, got "+Describe(n))
		return false
	}
	seen := make(map[string]int, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			bad(k, 0, path, "field names must be plain strings, got "+Describe(k))
			continue
		}
		key := k.Value
		fpath := key
		if path != "" {
			fpath = path + "." + key
		}
		if key == "<<" && k.ShortTag() == "!!merge" {
			bad(k, 0, path, "merge keys (<<) are not supported")
			continue
		}
		if first, dup := seen[key]; dup {
			bad(k, k.Line, fpath, "duplicate field "+strconv.Quote(key)+" (first at line "+strconv.Itoa(first)+")")
			continue
		}
		seen[key] = k.Line
		if !slices.Contains(known, key) {
			bad(k, k.Line, fpath, "unknown field "+strconv.Quote(key)+" (want one of "+strings.Join(known, ", ")+")")
			continue
		}
		field(key, k, fpath, v)
	}
	return true
}

package quota

import (
	"math/bits"
	"net/textproto"
	"slices"
	"strings"
)

// normalizeMatch returns m with methods upper-cased, sorted and deduplicated,
// and a prefix's trailing "/" removed. It does not alias m's slices.
func normalizeMatch(m Match) Match {
	n := Match{Path: m.Path, Prefix: m.Prefix, Pattern: m.Pattern}
	if n.Prefix != "" {
		n.Prefix = strings.TrimRight(n.Prefix, "/")
		if n.Prefix == "" {
			n.Prefix = "/"
		}
	}
	if len(m.Methods) > 0 {
		n.Methods = make([]string, len(m.Methods))
		for i, meth := range m.Methods {
			n.Methods[i] = strings.ToUpper(meth)
		}
		slices.Sort(n.Methods)
		n.Methods = slices.Compact(n.Methods)
	}
	return n
}

func normalizeKey(k KeySource) KeySource {
	if k.Kind == KeyHeader {
		return KeySource{Kind: KeyHeader, Name: textproto.CanonicalMIMEHeaderKey(k.Name)}
	}
	return k
}

// segKind is the kind of one segment of a pattern.
type segKind uint8

const (
	segLiteral segKind = iota
	segParam
	segStar
)

type patSeg struct {
	kind segKind
	lit  string // literal text, or the parameter name
}

// parsePattern splits a pattern into segments, or returns a message saying
// what is wrong with it.
func parsePattern(p string) ([]patSeg, string) {
	if !strings.HasPrefix(p, "/") {
		return nil, `must start with "/"`
	}
	parts := strings.Split(p[1:], "/")
	segs := make([]patSeg, 0, len(parts))
	var names []string
	for i, s := range parts {
		switch {
		case s == "*":
			if i != len(parts)-1 {
				return nil, `"*" may only be the last segment`
			}
			segs = append(segs, patSeg{kind: segStar})
		case strings.HasPrefix(s, "{") && strings.HasSuffix(s, "}") && len(s) >= 2:
			name := s[1 : len(s)-1]
			if !validParamName(name) {
				return nil, "invalid parameter name " + quote(name) + " (want a letter or _ then letters, digits, _)"
			}
			if slices.Contains(names, name) {
				return nil, "duplicate parameter {" + name + "}"
			}
			names = append(names, name)
			segs = append(segs, patSeg{kind: segParam, lit: name})
		case strings.ContainsAny(s, "{}*"):
			return nil, "segment " + quote(s) + ` mixes "{", "}" or "*" with text (a segment is a literal, {name} or a final *)`
		default:
			segs = append(segs, patSeg{kind: segLiteral, lit: s})
		}
	}
	return segs, ""
}

func validParamName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_', 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case '0' <= c && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// Method bits for the common methods, so that a method filter is one AND.
var stdMethods = [...]string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE"}

func methodBit(m string) uint16 {
	for i, s := range stdMethods {
		if m == s {
			return 1 << i
		}
	}
	if hasLower(m) {
		for i, s := range stdMethods {
			if strings.EqualFold(m, s) {
				return 1 << i
			}
		}
	}
	return 0
}

// methodFilter is a compiled Match.Methods.
type methodFilter struct {
	all   bool
	mask  uint16
	other []string // upper-case methods outside stdMethods
}

func compileMethods(methods []string) methodFilter {
	if len(methods) == 0 {
		return methodFilter{all: true}
	}
	var f methodFilter
	for _, m := range methods {
		if b := methodBit(m); b != 0 {
			f.mask |= b
		} else {
			f.other = append(f.other, m)
		}
	}
	return f
}

func (f *methodFilter) allows(bit uint16, method string) bool {
	if f.all || f.mask&bit != 0 {
		return true
	}
	if bit == 0 {
		for _, o := range f.other {
			if strings.EqualFold(o, method) {
				return true
			}
		}
	}
	return false
}

// trieNode is one path segment of the prefix/pattern trie.
type trieNode struct {
	lit   map[string]*trieNode
	param *trieNode // child for a {name} segment
	end   []int32   // patterns that end here
	rest  []int32   // prefixes and "*" patterns: match here and below
}

func (n *trieNode) child(seg patSeg) *trieNode {
	if seg.kind == segParam {
		if n.param == nil {
			n.param = &trieNode{}
		}
		return n.param
	}
	if n.lit == nil {
		n.lit = make(map[string]*trieNode)
	}
	c := n.lit[seg.lit]
	if c == nil {
		c = &trieNode{}
		n.lit[seg.lit] = c
	}
	return c
}

// matcher finds the rules that apply to a request. It is immutable once
// built and safe for concurrent use.
type matcher struct {
	methods  []methodFilter // by rule index
	exact    map[string][]int32
	root     trieNode
	catchAll []int32 // rules without a path matcher, checked by method
	// catchAllBy[k] is catchAll pre-filtered for stdMethods[k], so that
	// many method-filtered catch-all rules cost nothing for other methods.
	catchAllBy [len(stdMethods)][]int32
}

// newMatcher compiles normalised, valid rules.
func newMatcher(rules []Rule) *matcher {
	m := &matcher{methods: make([]methodFilter, len(rules)), exact: make(map[string][]int32)}
	for i := range rules {
		r := &rules[i]
		idx := int32(i)
		m.methods[i] = compileMethods(r.Match.Methods)
		switch {
		case r.Match.Path != "":
			m.exact[r.Match.Path] = append(m.exact[r.Match.Path], idx)
		case r.Match.Prefix != "":
			n := &m.root
			if r.Match.Prefix != "/" {
				for _, s := range strings.Split(r.Match.Prefix[1:], "/") {
					n = n.child(patSeg{kind: segLiteral, lit: s})
				}
			}
			n.rest = append(n.rest, idx)
		case r.Match.Pattern != "":
			segs, _ := parsePattern(r.Match.Pattern)
			n := &m.root
			for _, s := range segs {
				if s.kind == segStar {
					n.rest = append(n.rest, idx)
					n = nil
					break
				}
				n = n.child(s)
			}
			if n != nil {
				n.end = append(n.end, idx)
			}
		default:
			m.catchAll = append(m.catchAll, idx)
			for k, meth := range stdMethods {
				if m.methods[i].allows(1<<k, meth) {
					m.catchAllBy[k] = append(m.catchAllBy[k], idx)
				}
			}
		}
	}
	return m
}

func (m *matcher) add(dst []int, ids []int32, bit uint16, method string) []int {
	for _, i := range ids {
		if m.methods[i].allows(bit, method) {
			dst = append(dst, int(i))
		}
	}
	return dst
}

// match appends the indices of the rules that apply, in ascending order.
func (m *matcher) match(method, path string, dst []int) []int {
	start := len(dst)
	bit := methodBit(method)
	if bit != 0 {
		for _, i := range m.catchAllBy[bits.TrailingZeros16(bit)] {
			dst = append(dst, int(i))
		}
	} else {
		dst = m.add(dst, m.catchAll, bit, method)
	}
	if ids, ok := m.exact[path]; ok {
		dst = m.add(dst, ids, bit, method)
	}
	if strings.HasPrefix(path, "/") {
		dst = m.walk(&m.root, path[1:], false, dst, bit, method)
	}
	if len(dst)-start > 1 {
		slices.Sort(dst[start:])
	}
	return dst
}

// walk visits n, which has consumed the segments before rest; done reports
// that no segment is left (as opposed to one empty segment). Every trie
// node is reached by one sequence of literal/param choices, so each is
// visited at most once per path and no index is appended twice.
func (m *matcher) walk(n *trieNode, rest string, done bool, dst []int, bit uint16, method string) []int {
	dst = m.add(dst, n.rest, bit, method)
	if done {
		return m.add(dst, n.end, bit, method)
	}
	if len(n.lit) == 0 && n.param == nil {
		return dst // a leaf: no deeper rule can match
	}
	seg, next, last := rest, "", true
	if i := strings.IndexByte(rest, '/'); i >= 0 {
		seg, next, last = rest[:i], rest[i+1:], false
	}
	if c, ok := n.lit[seg]; ok {
		dst = m.walk(c, next, last, dst, bit, method)
	}
	if n.param != nil && seg != "" {
		dst = m.walk(n.param, next, last, dst, bit, method)
	}
	return dst
}

package quota

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/weir-dev/weir/internal/yamlwalk"
)

// MaxFileSize is the largest rules file Parse accepts, in bytes.
const MaxFileSize = 16 << 20

// LoadFile reads and parses the rules file at path; errors name the file by
// its base name (see Parse). A read error is returned wrapped, with the path.
func LoadFile(path string) ([]Rule, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("quota: reading rules: %w", err)
	}
	return Parse(filepath.Base(path), data)
}

// Parse parses a rules file (format in docs/rules.md) and validates the
// rules. filename is used only in errors, which read
// "rules.yaml:14: rules[3].window: must be positive". Every problem found is
// returned, each an *Error, joined with errors.Join. Unknown and duplicate
// fields are errors; so is an empty file (ErrNoRules), while "rules: []" is
// a valid empty set. Parse never panics. The rules are returned as written,
// with zero values for omitted fields; NewSet fills in the defaults.
func Parse(filename string, data []byte) (rules []Rule, err error) {
	defer func() {
		if v := recover(); v != nil {
			rules, err = nil, &Error{File: filename, Msg: fmt.Sprintf("cannot parse: %v", v), Err: ErrSyntax}
		}
	}()
	p := &parser{file: filename, lines: make(map[string]int), bad: make(map[string]bool)}
	if len(data) > MaxFileSize {
		return nil, &Error{File: filename, Msg: fmt.Sprintf("file is %d bytes, above the %d byte limit", len(data), MaxFileSize), Err: ErrSyntax}
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, p.noRules()
		}
		return nil, p.yamlError(err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		if err != nil {
			return nil, p.yamlError(err)
		}
		return nil, &Error{File: filename, Line: extra.Line, Msg: "more than one YAML document; put every rule under one rules: list", Err: ErrSyntax}
	}
	root := &doc
	if root.Kind == yaml.DocumentNode {
		if len(root.Content) == 0 {
			return nil, p.noRules()
		}
		root = root.Content[0]
	}
	root = p.resolve(root, "")
	if root == nil {
		return nil, joinErrors(p.errs)
	}
	if isNull(root) {
		return nil, p.noRules()
	}
	rules, found := p.top(root)
	if len(p.errs) > 0 {
		// Report validation problems too, except on fields that did not parse.
		p.validation(rules)
		return nil, joinErrors(p.errs)
	}
	if !found {
		return nil, &Error{File: filename, Line: root.Line, Field: "rules", Msg: "missing; write rules: [] for an empty set", Err: ErrNoRules}
	}
	p.validation(rules)
	if len(p.errs) > 0 {
		return nil, joinErrors(p.errs)
	}
	return rules, nil
}

type parser struct {
	file  string
	errs  []*Error
	lines map[string]int  // field path -> line of its key
	bad   map[string]bool // field paths that did not parse
}

func (p *parser) noRules() error {
	return &Error{File: p.file, Msg: "no rules: the file is empty (write rules: [] for an empty set)", Err: ErrNoRules}
}

func (p *parser) yamlError(err error) error {
	line, msg := yamlwalk.SyntaxError(err)
	return &Error{File: p.file, Line: line, Msg: msg, Err: ErrSyntax}
}

// syntax records a problem with the field at path, whose node is n.
func (p *parser) syntax(n *yaml.Node, path, format string, args ...any) {
	line := 0
	if l, ok := p.lines[path]; ok {
		line = l
	} else if n != nil {
		line = n.Line
	}
	p.syntaxLine(line, path, format, args...)
}

// syntaxLine records a problem at a given line.
func (p *parser) syntaxLine(line int, path, format string, args ...any) {
	p.bad[path] = true
	p.errs = append(p.errs, &Error{File: p.file, Line: line, Field: path, Msg: fmt.Sprintf(format, args...), Err: ErrSyntax})
}

// validation runs Validate and adds its problems with file and line,
// skipping fields (and their children) that already failed to parse.
func (p *parser) validation(rules []Rule) {
	for _, e := range validate(rules) {
		if p.badPath(e.Field) {
			continue
		}
		e.File = p.file
		e.Line = p.lineOf(e.Field)
		p.errs = append(p.errs, e)
	}
}

// parent returns the field path one level up: "a.b[2]" -> "a.b" -> "a".
func parent(path string) string {
	i := strings.LastIndexAny(path, ".[")
	if i < 0 {
		return ""
	}
	return path[:i]
}

func (p *parser) badPath(path string) bool {
	for ; path != ""; path = parent(path) {
		if p.bad[path] {
			return true
		}
	}
	return false
}

func (p *parser) lineOf(path string) int {
	for ; path != ""; path = parent(path) {
		if l, ok := p.lines[path]; ok {
			return l
		}
	}
	return 0
}

// resolve follows aliases; it returns nil (and records why) for an alias
// chain that does not end.
func (p *parser) resolve(n *yaml.Node, path string) *yaml.Node {
	n, why := yamlwalk.Resolve(n)
	if n == nil {
		p.syntax(nil, path, "%s", why)
	}
	return n
}

func isNull(n *yaml.Node) bool { return yamlwalk.IsNull(n) }

// describe names what a node is, for "expected X, got Y" messages.
func describe(n *yaml.Node) string { return yamlwalk.Describe(n) }

// mapping walks a mapping node (yamlwalk.Mapping), calling field for each
// known key with its resolved value. Unknown keys, duplicate keys, merge
// keys and non-scalar keys are reported. It returns false if n is not a
// mapping.
func (p *parser) mapping(n *yaml.Node, path string, known []string, field func(key string, v *yaml.Node, fpath string)) bool {
	return yamlwalk.Mapping(n, path, known, p.walkProblem, func(key string, k *yaml.Node, fpath string, v *yaml.Node) {
		p.lines[fpath] = k.Line
		if v = p.resolve(v, fpath); v != nil {
			field(key, v, fpath)
		}
	})
}

// walkProblem records a problem yamlwalk found: at the line it names, else
// at the field's own line.
func (p *parser) walkProblem(n *yaml.Node, line int, field, msg string) {
	if line != 0 {
		p.syntaxLine(line, field, "%s", msg)
		return
	}
	p.syntax(n, field, "%s", msg)
}

// top parses the document's root mapping.
func (p *parser) top(root *yaml.Node) (rules []Rule, found bool) {
	p.mapping(root, "", []string{"rules"}, func(_ string, v *yaml.Node, path string) {
		found = true
		if isNull(v) {
			p.syntax(v, path, "expected a list of rules, got null (write rules: [] for an empty set)")
			return
		}
		if v.Kind != yaml.SequenceNode {
			p.syntax(v, path, "expected a list of rules, got %s", describe(v))
			return
		}
		rules = make([]Rule, len(v.Content))
		for i, item := range v.Content {
			rpath := fmt.Sprintf("rules[%d]", i)
			p.lines[rpath] = item.Line
			if item = p.resolve(item, rpath); item == nil {
				continue
			}
			start := len(p.errs)
			p.rule(item, rpath, &rules[i])
			if idRE.MatchString(rules[i].ID) {
				for _, e := range p.errs[start:] {
					e.RuleID = rules[i].ID
				}
			}
		}
	})
	return rules, found
}

var ruleFields = []string{"id", "description", "match", "key", "limit", "window", "burst", "cost", "cost_by_method",
	"algorithm", "mode", "durable", "scope", "on_failure", "accuracy", "shadow", "count_rejected", "enforce_regions", "max_delay", "overrides", "tiers", "penalty", "sketch"}

// rule parses one rule mapping into r, field by field; the nested mappings
// (overrides, tiers, penalty, sketch, cost_by_method) each have a helper.
func (p *parser) rule(n *yaml.Node, path string, r *Rule) {
	p.mapping(n, path, ruleFields, func(key string, v *yaml.Node, f string) {
		switch key {
		case "id":
			r.ID = p.str(v, f)
		case "description":
			r.Description = p.str(v, f)
		case "match":
			p.match(v, f, &r.Match)
		case "key":
			p.list(v, f, func(item *yaml.Node, ip string) {
				r.Key = append(r.Key, p.keySource(item, ip))
			})
		case "limit":
			r.Limit = p.int(v, f)
		case "window":
			r.Window = p.duration(v, f)
		case "burst":
			r.Burst = p.positiveInt(v, f)
		case "cost":
			r.Cost = p.positiveInt(v, f)
		case "cost_by_method":
			if isNull(v) {
				return
			}
			r.CostByMethod = p.costByMethod(v, f)
		case "algorithm":
			r.Algorithm = Algorithm(p.str(v, f))
		case "mode":
			r.Mode = Mode(p.str(v, f))
		case "durable":
			r.Durable = p.bool(v, f)
		case "scope":
			r.Scope = Scope(p.str(v, f))
		case "on_failure":
			r.OnFailure = OnFailure(p.str(v, f))
		case "accuracy":
			r.Accuracy = p.float(v, f)
			if r.Accuracy == 0 && !p.bad[f] {
				p.syntax(v, f, "must be in (0, 0.5]; omit the field for the default 0.05")
			}
		case "shadow":
			r.Shadow = p.bool(v, f)
		case "count_rejected":
			r.CountRejected = p.bool(v, f)
		case "enforce_regions":
			p.list(v, f, func(item *yaml.Node, ip string) {
				r.EnforceRegions = append(r.EnforceRegions, p.str(item, ip))
			})
		case "max_delay":
			r.MaxDelay = p.duration(v, f)
			if r.MaxDelay == 0 && !p.bad[f] {
				p.syntax(v, f, "must be positive; omit the field for the default (burst-1) × window/limit")
			}
		case "overrides":
			p.list(v, f, func(item *yaml.Node, ip string) {
				r.Overrides = append(r.Overrides, p.override(item, ip))
			})
		case "tiers":
			p.list(v, f, func(item *yaml.Node, ip string) {
				r.Tiers = append(r.Tiers, p.tier(item, ip))
			})
		case "penalty":
			if isNull(v) {
				return
			}
			if pen := p.penalty(v, f); pen != nil {
				r.Penalty = pen
			}
		case "sketch":
			if isNull(v) {
				return
			}
			if sk := p.sketch(v, f); sk != nil {
				r.Sketch = sk
			}
		}
	})
}

// costByMethod parses cost_by_method, a mapping from HTTP method to cost
// whose keys are free-form (validation checks them as method tokens).
func (p *parser) costByMethod(n *yaml.Node, path string) map[string]int64 {
	costs := map[string]int64{}
	p.mappingAny(n, path, func(k string, v *yaml.Node, kp string) {
		costs[k] = p.int(v, kp)
	})
	return costs
}

// override parses one entry of overrides. A source given but naming no key
// source is refused, pointing to the way to pick the key's first source:
// leaving the field out.
func (p *parser) override(n *yaml.Node, path string) Override {
	var o Override
	p.mapping(n, path, []string{"identity", "source", "limit", "burst"}, func(k string, v *yaml.Node, kp string) {
		switch k {
		case "identity":
			o.Identity = p.str(v, kp)
		case "source":
			o.Source = p.keySource(v, kp)
			if o.Source == (KeySource{}) && !p.bad[kp] {
				p.syntax(v, kp, "must name a source of the rule's key (header:NAME, user or ip); omit the field for the key's first source")
			}
		case "limit":
			o.Limit = p.positiveInt(v, kp)
		case "burst":
			o.Burst = p.positiveInt(v, kp)
		}
	})
	return o
}

// tier parses one entry of tiers.
func (p *parser) tier(n *yaml.Node, path string) Tier {
	var t Tier
	p.mapping(n, path, []string{"name", "limit", "burst"}, func(k string, v *yaml.Node, kp string) {
		switch k {
		case "name":
			t.Name = p.str(v, kp)
		case "limit":
			t.Limit = p.int(v, kp)
		case "burst":
			t.Burst = p.positiveInt(v, kp)
		}
	})
	return t
}

// penalty parses the penalty mapping; it returns nil when n is not a
// mapping (the problem is already recorded), so the rule keeps no penalty.
// A within of zero is refused, pointing to the way to get the default:
// leaving the field out.
func (p *parser) penalty(n *yaml.Node, path string) *Penalty {
	var pen Penalty
	if !p.mapping(n, path, []string{"after", "within", "base", "max"}, func(k string, v *yaml.Node, kp string) {
		switch k {
		case "after":
			pen.After = p.int(v, kp)
		case "within":
			pen.Within = p.duration(v, kp)
			if pen.Within == 0 && !p.bad[kp] {
				p.syntax(v, kp, "must be positive; omit the field for the default 1m")
			}
		case "base":
			pen.Base = p.duration(v, kp)
		case "max":
			pen.Max = p.duration(v, kp)
		}
	}) {
		return nil
	}
	return &pen
}

// sketch parses the sketch mapping; it returns nil when n is not a mapping
// (the problem is already recorded), so the rule keeps no sketch. A period
// of zero is refused, pointing to the way to get the default: leaving the
// field out.
func (p *parser) sketch(n *yaml.Node, path string) *Sketch {
	var sk Sketch
	if !p.mapping(n, path, []string{"threshold", "period", "width", "depth"}, func(k string, v *yaml.Node, kp string) {
		switch k {
		case "threshold":
			sk.Threshold = p.int(v, kp)
		case "period":
			sk.Period = p.duration(v, kp)
			if sk.Period == 0 && !p.bad[kp] {
				p.syntax(v, kp, "must be positive; omit the field for the default (the rule's window)")
			}
		case "width":
			sk.Width = p.positiveInt(v, kp)
		case "depth":
			sk.Depth = p.positiveInt(v, kp)
		}
	}) {
		return nil
	}
	return &sk
}

func (p *parser) match(n *yaml.Node, path string, m *Match) {
	if isNull(n) {
		return
	}
	p.mapping(n, path, []string{"path", "prefix", "pattern", "methods"}, func(k string, v *yaml.Node, f string) {
		switch k {
		case "path":
			m.Path = p.str(v, f)
		case "prefix":
			m.Prefix = p.str(v, f)
		case "pattern":
			m.Pattern = p.str(v, f)
		case "methods":
			p.list(v, f, func(item *yaml.Node, ip string) {
				m.Methods = append(m.Methods, p.str(item, ip))
			})
		}
	})
}

// mappingAny walks a mapping with free-form string keys.
func (p *parser) mappingAny(n *yaml.Node, path string, field func(key string, v *yaml.Node, fpath string)) {
	if n.Kind != yaml.MappingNode {
		p.syntax(n, path, "expected a mapping, got %s", describe(n))
		return
	}
	seen := make(map[string]int, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode || isNull(k) {
			p.syntax(k, path, "keys must be plain strings, got %s", describe(k))
			continue
		}
		fpath := path + "." + k.Value
		if k.Value == "<<" && k.ShortTag() == "!!merge" {
			p.syntax(k, path, "merge keys (<<) are not supported")
			continue
		}
		if first, dup := seen[k.Value]; dup {
			p.syntaxLine(k.Line, fpath, "duplicate field %s (first at line %d)", strconv.Quote(k.Value), first)
			continue
		}
		seen[k.Value] = k.Line
		p.lines[fpath] = k.Line
		if v = p.resolve(v, fpath); v == nil {
			continue
		}
		field(k.Value, v, fpath)
	}
}

// list walks a sequence; a single scalar counts as a list of one and null
// as an empty list.
func (p *parser) list(n *yaml.Node, path string, item func(v *yaml.Node, ipath string)) {
	switch {
	case isNull(n):
	case n.Kind == yaml.ScalarNode:
		p.lines[path+"[0]"] = n.Line
		item(n, path+"[0]")
	case n.Kind == yaml.SequenceNode:
		for i, v := range n.Content {
			ip := fmt.Sprintf("%s[%d]", path, i)
			p.lines[ip] = v.Line
			if v = p.resolve(v, ip); v != nil {
				item(v, ip)
			}
		}
	default:
		p.syntax(n, path, "expected a list, got %s", describe(n))
	}
}

func (p *parser) keySource(n *yaml.Node, path string) KeySource {
	if n.Kind == yaml.MappingNode {
		p.syntax(n, path, "expected a string like header:X-API-Key, got a mapping (write header:NAME with no space after the colon)")
		return KeySource{}
	}
	s := p.str(n, path)
	kind, name, _ := strings.Cut(s, ":")
	return KeySource{Kind: KeyKind(kind), Name: name}
}

func (p *parser) str(n *yaml.Node, path string) string {
	if n.Kind != yaml.ScalarNode || isNull(n) {
		p.syntax(n, path, "expected a string, got %s", describe(n))
		return ""
	}
	return n.Value
}

func (p *parser) int(n *yaml.Node, path string) int64 {
	var x int64
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" || n.Decode(&x) != nil {
		p.syntax(n, path, "expected an integer, got %s", describe(n))
		return 0
	}
	return x
}

// positiveInt parses an optional integer whose zero value means a default:
// writing 0 explicitly is refused, since it reads as "nothing allowed".
func (p *parser) positiveInt(n *yaml.Node, path string) int64 {
	x := p.int(n, path)
	if x == 0 && !p.bad[path] {
		p.syntax(n, path, "must be positive; omit the field for the default")
	}
	return x
}

func (p *parser) float(n *yaml.Node, path string) float64 {
	var x float64
	tag := n.ShortTag()
	if n.Kind != yaml.ScalarNode || (tag != "!!float" && tag != "!!int") || n.Decode(&x) != nil {
		p.syntax(n, path, "expected a number, got %s", describe(n))
		return 0
	}
	return x
}

func (p *parser) bool(n *yaml.Node, path string) bool {
	var x bool
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" || n.Decode(&x) != nil {
		p.syntax(n, path, "expected true or false, got %s", describe(n))
		return false
	}
	return x
}

func (p *parser) duration(n *yaml.Node, path string) time.Duration {
	if n.Kind != yaml.ScalarNode || isNull(n) {
		p.syntax(n, path, "expected a duration like \"1m\", got %s", describe(n))
		return 0
	}
	if n.ShortTag() == "!!int" || n.ShortTag() == "!!float" {
		p.syntax(n, path, "expected a duration with a unit like \"1m\" or \"500ms\", got %s", n.Value)
		return 0
	}
	d, err := time.ParseDuration(n.Value)
	if err != nil {
		p.syntax(n, path, "expected a duration like \"1m\" or \"500ms\", got %s", strconv.Quote(n.Value))
		return 0
	}
	return d
}

// Marshal encodes rules in the file format Parse reads, in normalised form
// (defaults written out). Parse(Marshal(rules)) yields rules with the same
// Set digest. It returns the validation errors if the rules are invalid.
func Marshal(rules []Rule) ([]byte, error) {
	if err := Validate(rules); err != nil {
		return nil, err
	}
	out := yFile{Rules: make([]yRule, len(rules))}
	for i, r := range rules {
		r = normalize(r)
		y := yRule{
			ID: r.ID, Description: r.Description, Limit: r.Limit, Window: r.Window.String(),
			Burst: r.Burst, Cost: r.Cost, CostByMethod: r.CostByMethod, Algorithm: string(r.Algorithm),
			Mode: string(r.Mode), Durable: r.Durable, Scope: string(r.Scope), OnFailure: string(r.OnFailure),
			Accuracy: r.Accuracy, Shadow: r.Shadow, CountRejected: r.CountRejected, EnforceRegions: r.EnforceRegions,
		}
		if r.Match.Path != "" || r.Match.Prefix != "" || r.Match.Pattern != "" || len(r.Match.Methods) > 0 {
			y.Match = &yMatch{Path: r.Match.Path, Prefix: r.Match.Prefix, Pattern: r.Match.Pattern, Methods: r.Match.Methods}
		}
		for _, k := range r.Key {
			y.Key = append(y.Key, k.String())
		}
		if r.MaxDelay > 0 {
			y.MaxDelay = r.MaxDelay.String()
		}
		for _, o := range r.Overrides {
			yo := yOverride{Identity: o.Identity, Limit: o.Limit, Burst: o.Burst}
			if o.Source != (KeySource{}) {
				yo.Source = o.Source.String()
			}
			y.Overrides = append(y.Overrides, yo)
		}
		for _, t := range r.Tiers {
			y.Tiers = append(y.Tiers, yTier(t))
		}
		if pen := r.Penalty; pen != nil {
			y.Penalty = &yPenalty{After: pen.After, Within: pen.Within.String(), Base: pen.Base.String(), Max: pen.Max.String()}
		}
		if sk := r.Sketch; sk != nil {
			y.Sketch = &ySketch{Threshold: sk.Threshold, Period: sk.Period.String(), Width: sk.Width, Depth: sk.Depth}
		}
		out.Rules[i] = y
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(out); err != nil {
		return nil, fmt.Errorf("quota: marshal: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("quota: marshal: %w", err)
	}
	return buf.Bytes(), nil
}

type yFile struct {
	Rules []yRule `yaml:"rules"`
}

type yRule struct {
	ID             string           `yaml:"id"`
	Description    string           `yaml:"description,omitempty"`
	Match          *yMatch          `yaml:"match,omitempty,flow"`
	Key            []string         `yaml:"key,omitempty,flow"`
	Limit          int64            `yaml:"limit"`
	Window         string           `yaml:"window"`
	Burst          int64            `yaml:"burst,omitempty"`
	Cost           int64            `yaml:"cost,omitempty"`
	CostByMethod   map[string]int64 `yaml:"cost_by_method,omitempty,flow"`
	Algorithm      string           `yaml:"algorithm,omitempty"`
	Mode           string           `yaml:"mode,omitempty"`
	Durable        bool             `yaml:"durable,omitempty"`
	Scope          string           `yaml:"scope,omitempty"`
	OnFailure      string           `yaml:"on_failure,omitempty"`
	Accuracy       float64          `yaml:"accuracy,omitempty"`
	Shadow         bool             `yaml:"shadow,omitempty"`
	CountRejected  bool             `yaml:"count_rejected,omitempty"`
	EnforceRegions []string         `yaml:"enforce_regions,omitempty,flow"`
	MaxDelay       string           `yaml:"max_delay,omitempty"`
	Overrides      []yOverride      `yaml:"overrides,omitempty"`
	Tiers          []yTier          `yaml:"tiers,omitempty"`
	Penalty        *yPenalty        `yaml:"penalty,omitempty,flow"`
	Sketch         *ySketch         `yaml:"sketch,omitempty,flow"`
}

type yMatch struct {
	Path    string   `yaml:"path,omitempty"`
	Prefix  string   `yaml:"prefix,omitempty"`
	Pattern string   `yaml:"pattern,omitempty"`
	Methods []string `yaml:"methods,omitempty"`
}

type yOverride struct {
	Identity string `yaml:"identity"`
	Source   string `yaml:"source,omitempty"`
	Limit    int64  `yaml:"limit,omitempty"`
	Burst    int64  `yaml:"burst,omitempty"`
}

type yTier struct {
	Name  string `yaml:"name"`
	Limit int64  `yaml:"limit"`
	Burst int64  `yaml:"burst,omitempty"`
}

type yPenalty struct {
	After  int64  `yaml:"after"`
	Within string `yaml:"within"`
	Base   string `yaml:"base"`
	Max    string `yaml:"max"`
}

type ySketch struct {
	Threshold int64  `yaml:"threshold"`
	Period    string `yaml:"period"`
	Width     int64  `yaml:"width"`
	Depth     int64  `yaml:"depth"`
}

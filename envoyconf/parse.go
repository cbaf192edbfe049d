package envoyconf

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/weir-dev/weir/internal/yamlwalk"
	"github.com/weir-dev/weir/quota"
)

// MaxFileSize is the largest descriptor file Parse accepts, in bytes.
const MaxFileSize = 16 << 20

// maxDepth bounds descriptor nesting, so that a hostile file cannot make the
// loader recurse without end.
const maxDepth = 64

// Unit is the time unit of a limit. Its values are those of Envoy's
// RateLimitResponse.RateLimit.Unit, so a conversion is a cast. The zero
// value is not a valid unit.
type Unit int32

// The units envoyproxy/ratelimit accepts (case-insensitive in files).
const (
	UnitSecond Unit = 1
	UnitMinute Unit = 2
	UnitHour   Unit = 3
	UnitDay    Unit = 4
	UnitMonth  Unit = 5 // 30 days, as envoyproxy/ratelimit counts it
	UnitYear   Unit = 6 // 365 days
	UnitWeek   Unit = 7
)

var unitNames = map[string]Unit{
	"second": UnitSecond, "minute": UnitMinute, "hour": UnitHour, "day": UnitDay,
	"week": UnitWeek, "month": UnitMonth, "year": UnitYear,
}

// String returns the unit's name in lower case ("minute"), or "unknown".
func (u Unit) String() string {
	for name, v := range unitNames {
		if v == u {
			return name
		}
	}
	return "unknown"
}

// Duration returns the unit's length: a month is 30 days and a year 365, as
// envoyproxy/ratelimit counts them. An invalid unit has length zero.
func (u Unit) Duration() time.Duration {
	const day = 24 * time.Hour
	switch u {
	case UnitSecond:
		return time.Second
	case UnitMinute:
		return time.Minute
	case UnitHour:
		return time.Hour
	case UnitDay:
		return day
	case UnitWeek:
		return 7 * day
	case UnitMonth:
		return 30 * day
	case UnitYear:
		return 365 * day
	}
	return 0
}

// Domain is one parsed descriptor file: a domain and its descriptor tree.
type Domain struct {
	// Name is the domain Envoy sends in RateLimitRequest.domain.
	Name string
	// File is the base name of the file it came from (for errors).
	File string
	// Descriptors are the top-level descriptors, in file order.
	Descriptors []*Descriptor
}

// Descriptor is one node of a domain's descriptor tree.
type Descriptor struct {
	// Key is required. Value is optional: empty matches any value of Key
	// (each distinct value its own bucket); a value ending in "*" matches
	// every value with that prefix.
	Key, Value string
	// RateLimit is nil for a descriptor that only groups nested ones.
	RateLimit *RateLimit
	// ShadowMode: the limit is counted but never rejects.
	ShadowMode bool
	// DetailedMetric names the limit's stats after the request's values,
	// every entry's key_value (Limit.ValueStats, Match.StatsKey).
	DetailedMetric bool
	// QuotaMode: over the limit the descriptor answers OK (see
	// Limit.Quota).
	QuotaMode bool
	// ValueToMetric puts the request's value of this level into the stats
	// name of the limits at and below it where the level matched by key
	// alone or by a wildcard (Limit.ValueStats, Match.StatsKey).
	ValueToMetric bool
	// ShareThreshold makes every value matching a wildcard value share one
	// bucket instead of one bucket per distinct value.
	ShareThreshold bool
	// Descriptors are the nested descriptors, in file order.
	Descriptors []*Descriptor
	// Line is the line of the descriptor in its file; Field its path there
	// ("descriptors[0].descriptors[2]").
	Line  int
	Field string
}

// RateLimit is a descriptor's limit.
type RateLimit struct {
	// Unit and RequestsPerUnit are the limit; Unit is zero when Unlimited.
	// RequestsPerUnit zero rejects every request (as in envoyproxy/ratelimit).
	Unit            Unit
	RequestsPerUnit uint32
	// Unlimited answers OK without counting.
	Unlimited bool
	// Name names the limit for Replaces; optional.
	Name string
	// Replaces lists the names of limits this one replaces: when both match
	// descriptors of one request, the replaced ones are not applied.
	Replaces []string
}

// LoadFile reads and parses the descriptor file at path; errors name the
// file by its base name (see Parse).
func LoadFile(path string) (*Domain, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("envoyconf: reading descriptors: %w", err)
	}
	return Parse(filepath.Base(path), data)
}

// Parse parses one envoyproxy/ratelimit descriptor file. filename is used
// only in errors, which are *quota.Error values ("ratelimit.yaml:14:
// descriptors[1].rate_limit.unit: invalid unit \"fortnight\" ..."), all of
// them joined with errors.Join. Unknown and duplicate fields, an empty
// domain or key, a duplicate descriptor, a unit with unlimited (or none
// without it) and bad replaces entries are errors, as in
// envoyproxy/ratelimit. Parse never panics.
func Parse(filename string, data []byte) (d *Domain, err error) {
	defer func() {
		if v := recover(); v != nil {
			d, err = nil, &quota.Error{File: filename, Msg: fmt.Sprintf("cannot parse: %v", v), Err: quota.ErrSyntax}
		}
	}()
	p := &parser{file: filename}
	if len(data) > MaxFileSize {
		return nil, p.errf(0, "", "file is %d bytes, above the %d byte limit", len(data), MaxFileSize)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, p.errf(0, "", "empty file: want a domain and descriptors")
		}
		return nil, p.yamlError(err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		if err != nil {
			return nil, p.yamlError(err)
		}
		return nil, p.errf(extra.Line, "", "more than one YAML document; write one domain per file")
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) > 0 {
		root = root.Content[0]
	}
	d = &Domain{File: filename}
	domainLine := root.Line
	p.mapping(root, "", []string{"domain", "descriptors"}, func(key string, v *yaml.Node, f string) {
		switch key {
		case "domain":
			d.Name = p.str(v, f)
			domainLine = v.Line
		case "descriptors":
			d.Descriptors = p.descriptors(v, f, 0)
		}
	})
	if d.Name == "" && !p.failed("domain") {
		p.errs = append(p.errs, p.errf(domainLine, "domain", "must not be empty"))
	}
	if len(p.errs) > 0 {
		return nil, joinErrors(p.errs)
	}
	return d, nil
}

type parser struct {
	file string
	errs []error
	bad  []string // fields that failed, so that "missing" is not reported twice
	// keyLine is the line of the key whose value mapping calls field for.
	keyLine int
}

func (p *parser) errf(line int, field, format string, args ...any) *quota.Error {
	return &quota.Error{File: p.file, Line: line, Field: field, Msg: fmt.Sprintf(format, args...), Err: quota.ErrSyntax}
}

func (p *parser) add(n *yaml.Node, field, format string, args ...any) {
	line := 0
	if n != nil {
		line = n.Line
	}
	p.bad = append(p.bad, field)
	p.errs = append(p.errs, p.errf(line, field, format, args...))
}

func (p *parser) failed(field string) bool {
	for _, b := range p.bad {
		if b == field {
			return true
		}
	}
	return false
}

func (p *parser) yamlError(err error) error {
	line, msg := yamlwalk.SyntaxError(err)
	return p.errf(line, "", "%s", msg)
}

func joinErrors(es []error) error {
	if len(es) == 0 {
		return nil
	}
	return errors.Join(es...)
}

func describe(n *yaml.Node) string { return yamlwalk.Describe(n) }

// resolve follows an alias chain, bounded.
func (p *parser) resolve(n *yaml.Node, field string) *yaml.Node {
	n, why := yamlwalk.Resolve(n)
	if n == nil {
		p.add(nil, field, "%s", why)
	}
	return n
}

// mapping walks a mapping (yamlwalk.Mapping), calling field for each known
// key; unknown, duplicate, merge and non-scalar keys are errors. A null
// node is an empty mapping.
func (p *parser) mapping(n *yaml.Node, path string, known []string, field func(key string, v *yaml.Node, f string)) {
	if yamlwalk.IsNull(n) {
		return
	}
	yamlwalk.Mapping(n, path, known, func(n *yaml.Node, _ int, f, msg string) {
		p.add(n, f, "%s", msg)
	}, func(key string, k *yaml.Node, f string, v *yaml.Node) {
		if v = p.resolve(v, f); v != nil {
			p.keyLine = k.Line
			field(key, v, f)
		}
	})
}

func (p *parser) str(n *yaml.Node, f string) string {
	if n.Kind != yaml.ScalarNode || n.ShortTag() == "!!null" {
		p.add(n, f, "expected a string, got %s", describe(n))
		return ""
	}
	return n.Value
}

func (p *parser) boolean(n *yaml.Node, f string) bool {
	var b bool
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" || n.Decode(&b) != nil {
		p.add(n, f, "expected true or false, got %s", describe(n))
		return false
	}
	return b
}

func (p *parser) uint32(n *yaml.Node, f string) uint32 {
	var v int64
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" || n.Decode(&v) != nil || v < 0 || v > math.MaxUint32 {
		p.add(n, f, "expected a whole number in [0, %d], got %s", uint32(math.MaxUint32), describe(n))
		return 0
	}
	return uint32(v)
}

func (p *parser) list(n *yaml.Node, f string) []*yaml.Node {
	if yamlwalk.IsNull(n) {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		p.add(n, f, "expected a list, got %s", describe(n))
		return nil
	}
	return n.Content
}

func (p *parser) descriptors(n *yaml.Node, f string, depth int) []*Descriptor {
	if depth >= maxDepth {
		p.add(n, f, "descriptors nested more than %d deep", maxDepth)
		return nil
	}
	var out []*Descriptor
	seen := map[string]int{}
	for i, item := range p.list(n, f) {
		df := fmt.Sprintf("%s[%d]", f, i)
		if item = p.resolve(item, df); item == nil {
			continue
		}
		d := &Descriptor{Line: item.Line, Field: df}
		p.mapping(item, df, []string{"key", "value", "rate_limit", "descriptors", "shadow_mode", "quota_mode", "detailed_metric", "value_to_metric", "share_threshold"},
			func(key string, v *yaml.Node, ff string) {
				switch key {
				case "key":
					d.Key = p.str(v, ff)
				case "value":
					d.Value = p.str(v, ff)
				case "rate_limit":
					d.RateLimit = p.rateLimit(v, ff, p.keyLine)
				case "descriptors":
					d.Descriptors = p.descriptors(v, ff, depth+1)
				case "shadow_mode":
					d.ShadowMode = p.boolean(v, ff)
				case "detailed_metric":
					d.DetailedMetric = p.boolean(v, ff)
				case "quota_mode":
					d.QuotaMode = p.boolean(v, ff)
				case "value_to_metric":
					d.ValueToMetric = p.boolean(v, ff)
				case "share_threshold":
					d.ShareThreshold = p.boolean(v, ff)
				}
			})
		if d.Key == "" {
			if !p.failed(df+".key") && !p.failed(df) {
				p.add(item, df+".key", "descriptor has an empty key")
			}
			continue
		}
		ck := compositeKey(d.Key, d.Value)
		if first, dup := seen[ck]; dup {
			p.add(item, df, "duplicate descriptor %q (first at line %d)", ck, first)
			continue
		}
		seen[ck] = item.Line
		if d.ShareThreshold && !strings.HasSuffix(ck, "*") {
			p.add(item, df+".share_threshold", "only a wildcard value (ending in *) can share its threshold")
		}
		out = append(out, d)
	}
	return out
}

func (p *parser) rateLimit(n *yaml.Node, f string, line int) *RateLimit {
	rl := &RateLimit{}
	unitText, unitLine, hasUnit := "", line, false
	p.mapping(n, f, []string{"unit", "requests_per_unit", "unlimited", "name", "replaces"}, func(key string, v *yaml.Node, ff string) {
		switch key {
		case "unit":
			unitText, unitLine, hasUnit = p.str(v, ff), v.Line, true
		case "requests_per_unit":
			rl.RequestsPerUnit = p.uint32(v, ff)
		case "unlimited":
			rl.Unlimited = p.boolean(v, ff)
		case "name":
			rl.Name = p.str(v, ff)
		case "replaces":
			for i, item := range p.list(v, ff) {
				rf := fmt.Sprintf("%s[%d]", ff, i)
				if item = p.resolve(item, rf); item == nil {
					continue
				}
				name := ""
				p.mapping(item, rf, []string{"name"}, func(_ string, nv *yaml.Node, nf string) { name = p.str(nv, nf) })
				if name == "" {
					p.add(item, rf+".name", "replaces entries must name a limit")
					continue
				}
				rl.Replaces = append(rl.Replaces, name)
			}
		}
	})
	unit, valid := unitNames[strings.ToLower(unitText)]
	switch {
	case p.failed(f + ".unit"):
	case rl.Unlimited && valid:
		p.errs = append(p.errs, p.errf(unitLine, f+".unit", "must not be set when unlimited is true"))
	case !rl.Unlimited && !valid:
		msg := "missing"
		if hasUnit {
			msg = fmt.Sprintf("invalid unit %q", unitText)
		}
		p.errs = append(p.errs, p.errf(unitLine, f+".unit", "%s: want second, minute, hour, day, week, month or year", msg))
	case !rl.Unlimited:
		rl.Unit = unit
	}
	for i, r := range rl.Replaces {
		if rl.Name != "" && r == rl.Name {
			p.errs = append(p.errs, p.errf(n.Line, fmt.Sprintf("%s.replaces[%d].name", f, i), "a limit cannot replace itself (%q)", r))
		}
	}
	return rl
}

// compositeKey is envoyproxy/ratelimit's map key for a descriptor: key, or
// key_value when the value is not empty.
func compositeKey(key, value string) string {
	if value == "" {
		return key
	}
	return key + "_" + value
}

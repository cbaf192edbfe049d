package main

import (
	"bytes"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/weir-dev/weir/internal/keyfile"
	"go.yaml.in/yaml/v3"
)

// Defaults of the daemon's addresses: every one on loopback, so that
// `weir serve --rules rules.yaml` is a working local node and nothing is
// reachable from elsewhere until the config says so.
const (
	defaultHTTP      = "127.0.0.1:8080"
	defaultRLS       = "127.0.0.1:8081"
	defaultGossip    = "127.0.0.1:7946"
	defaultPeerRPC   = "127.0.0.1:7947"
	defaultRaft      = "127.0.0.1:7001"
	defaultLeaseRPC  = "127.0.0.1:7002"
	defaultRegion    = "local"
	defaultTokensEnv = "WEIR_ADMIN_TOKENS"
	// maxConfigBytes bounds a config file: far above any real one.
	maxConfigBytes = 1 << 20
)

// Config is the daemon's configuration: the YAML file (docs/weir.md lists
// every field) with the command-line overrides applied. The zero Config,
// after applyDefaults, is a single node on loopback with no rules (which
// validate refuses: a daemon needs something to enforce).
type Config struct {
	Node           NodeSection    `yaml:"node"`
	Gossip         *GossipSection `yaml:"gossip"`
	Peer           PeerSection    `yaml:"peer"`
	Rules          RulesSection   `yaml:"rules"`
	Envoy          *EnvoySection  `yaml:"envoy"`
	Lease          *LeaseSection  `yaml:"lease"`
	HTTP           HTTPSection    `yaml:"http"`
	AdminTokens    TokensSection  `yaml:"admin_tokens"`
	TrustedProxies []string       `yaml:"trusted_proxies"`
	MaxKeys        int            `yaml:"max_keys"`
	Canary         *CanarySection `yaml:"canary"`
	Log            LogSection     `yaml:"log"`
	Shutdown       ShutdownConf   `yaml:"shutdown"`

	// file is the config file's name ("" for none); doc its YAML tree, for
	// the line of a field named in an error.
	file string
	doc  *yaml.Node
	// flagged are the fields a command-line flag set (their errors name
	// the flag, not a line of the file).
	flagged map[string]string
}

// NodeSection names the node.
type NodeSection struct {
	// Name is the node's name, unique in its cluster; default the host name.
	Name string `yaml:"name"`
	// Region is the node's region; default "local".
	Region string `yaml:"region"`
}

// GossipSection makes the node a member of its region's cluster. Without
// it (and without --gossip or --join) the node decides every rule alone.
type GossipSection struct {
	// Bind is the memberlist address, host:port (TCP and UDP).
	Bind string `yaml:"bind"`
	// Advertise is the address other members reach, when it differs.
	Advertise string `yaml:"advertise"`
	// Join lists gossip addresses of members to join; empty starts a cluster.
	Join []string `yaml:"join"`
	// Keys encrypt gossip; the first is the primary key (the one that
	// encrypts), the others are accepted too (rotation).
	Keys []KeySource `yaml:"keys"`
	// Label isolates clusters that share a network.
	Label string `yaml:"label"`
	// LocalTiming selects failure detection tuned for one machine.
	LocalTiming bool `yaml:"local_timing"`
}

// KeySource is one gossip key: a file holding it (raw 16, 24 or 32 bytes,
// or their base64) or its base64 inline.
type KeySource struct {
	File   string `yaml:"file"`
	Base64 string `yaml:"base64"`
}

// PeerSection configures the peer RPC between the members of a region.
type PeerSection struct {
	// RPC is the peer gRPC address, host:port.
	RPC string `yaml:"rpc"`
	// TLS secures peer RPC with mutual TLS.
	TLS *TLSFiles `yaml:"tls"`
	// SyncInterval, DecideTimeout, CallTimeout, HandoffTimeout: see
	// weir.ClusterConfig; zero means its default.
	SyncInterval   time.Duration `yaml:"sync_interval"`
	DecideTimeout  time.Duration `yaml:"decide_timeout"`
	CallTimeout    time.Duration `yaml:"call_timeout"`
	HandoffTimeout time.Duration `yaml:"handoff_timeout"`
}

// TLSFiles names PEM files: this side's certificate and key, and the CA
// that verifies the other side.
type TLSFiles struct {
	Cert string `yaml:"cert"`
	Key  string `yaml:"key"`
	CA   string `yaml:"ca"`
}

// RulesSection says where the node's rules come from: a watched rules file
// or the lease group (exclusive; envoy descriptors are the third source).
type RulesSection struct {
	File  string `yaml:"file"`
	Lease bool   `yaml:"lease"`
}

// EnvoySection serves Envoy's rate-limit service from envoyproxy/ratelimit
// descriptor files; their limits are then the node's rules.
type EnvoySection struct {
	// Listen is the RateLimitService gRPC address, host:port.
	Listen string `yaml:"listen"`
	// Descriptors are the descriptor files, one domain each.
	Descriptors []string `yaml:"descriptors"`
	// Directory is a directory of descriptor files, as envoyproxy/ratelimit's
	// runtime directory: every *.yaml and *.yml in it (dot entries and
	// subdirectories skipped, symlinks followed), one domain each. It is
	// watched, and so are the directories of Descriptors: a change (the
	// Kubernetes ConfigMap "..data" swap included) is served once it
	// compiles, as after SIGHUP.
	Directory string `yaml:"directory"`
	// Poll is how often the descriptor files are read again regardless of
	// change notifications; zero means 5s, negative disables it.
	Poll time.Duration `yaml:"poll"`
	// Mode, OnFailure and Accuracy apply to every imported rule
	// (envoyconf.Options).
	Mode      string  `yaml:"mode"`
	OnFailure string  `yaml:"on_failure"`
	Accuracy  float64 `yaml:"accuracy"`
	// FixedWindow keeps envoyproxy/ratelimit's fixed windows
	// (envoyconf.Options.FixedWindow): fixed_window rules in exact mode.
	FixedWindow bool `yaml:"fixed_window"`
	// Fidelity answers as envoyproxy/ratelimit does
	// (envoyconf.Options.Fidelity): fixed windows that count rejected hits,
	// and no response headers unless ResponseHeaders asks for some.
	Fidelity bool `yaml:"fidelity"`
	// ResponseHeaders is weir (weir's set), none or envoy
	// (envoyproxy/ratelimit's RateLimit-Limit, -Remaining, -Reset, as its
	// LIMIT_RESPONSE_HEADERS_ENABLED=true); "" means weir, or none with
	// Fidelity.
	ResponseHeaders string `yaml:"response_headers"`
	// HeaderNames rename envoy's three headers (its LIMIT_LIMIT_HEADER,
	// LIMIT_REMAINING_HEADER, LIMIT_RESET_HEADER); empty keeps a default.
	HeaderNames EnvoyHeaderNames `yaml:"header_names"`
	// ShadowMode answers every call OK overall, as envoyproxy/ratelimit's
	// SHADOW_MODE=true (statuses and counting unchanged).
	ShadowMode bool `yaml:"shadow_mode"`
	// MergeDomains merges the files of one domain, as
	// envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG=true.
	MergeDomains bool `yaml:"merge_domains"`
	// ValueSeries bounds the per-descriptor stats series named after
	// request values (value_to_metric, detailed_metric) per configured
	// descriptor (rls.WithValueSeries); zero means
	// rls.DefaultValueSeries, negative none.
	ValueSeries int `yaml:"value_series"`
}

// EnvoyHeaderNames are the names of envoy's response headers.
type EnvoyHeaderNames struct {
	Limit     string `yaml:"limit"`
	Remaining string `yaml:"remaining"`
	Reset     string `yaml:"reset"`
}

// LeaseSection connects the node to the lease group, as a voter or as a
// client of the voters.
type LeaseSection struct {
	Voter *VoterSection `yaml:"voter"`
	// Voters are the voters' lease RPC addresses, for a node that is not one.
	Voters []string `yaml:"voters"`
	// TLS secures lease RPC (both ways on a voter).
	TLS *TLSFiles `yaml:"tls"`
	// Regions every voter leases global limits to; default [node.region].
	Regions       []string      `yaml:"regions"`
	LeaseDuration time.Duration `yaml:"lease_duration"`
	MaxSkew       time.Duration `yaml:"max_skew"`
	CheckInterval time.Duration `yaml:"check_interval"`
}

// VoterSection makes the node a voter of the lease group.
type VoterSection struct {
	DataDir string `yaml:"data_dir"`
	Raft    string `yaml:"raft"`
	RPC     string `yaml:"rpc"`
	// Voters is the initial configuration (this node among them),
	// bootstrapped on first start; empty means a one-voter group of this
	// node.
	Voters []VoterAddr `yaml:"voters"`
}

// VoterAddr is one voter of the initial configuration.
type VoterAddr struct {
	Name string `yaml:"name"`
	Raft string `yaml:"raft"`
	RPC  string `yaml:"rpc"`
}

// HTTPSection is the operators' listener: admin API, metrics, status page.
type HTTPSection struct {
	Listen string `yaml:"listen"`
	// TLS serves HTTPS; CA, when set, verifies client certificates, which
	// then authenticate to the rules API like a token.
	TLS *TLSFiles `yaml:"tls"`
}

// TokensSection names where the rules API's bearer tokens come from, one
// "principal:token" each (see parseTokens).
type TokensSection struct {
	File string `yaml:"file"`
	Env  string `yaml:"env"`
}

// CanarySection turns on the enforcement canary (weir.CanaryConfig).
type CanarySection struct {
	Rule     string        `yaml:"rule"`
	Identity string        `yaml:"identity"`
	Interval time.Duration `yaml:"interval"`
	Window   time.Duration `yaml:"window"`
}

// LogSection configures the log on standard error.
type LogSection struct {
	// Level is debug, info (default), warn or error.
	Level string `yaml:"level"`
	// Format is text (default) or json.
	Format string `yaml:"format"`
}

// ShutdownConf bounds the graceful shutdown.
type ShutdownConf struct {
	// Drain bounds how long RLS calls and HTTP requests in flight may
	// finish after a SIGTERM; default 5s.
	Drain time.Duration `yaml:"drain"`
}

// ConfigError is a config problem: the file and line (when known), the
// field and what is wrong.
type ConfigError struct {
	File  string
	Line  int
	Field string
	Msg   string
}

func (e *ConfigError) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		if e.Line > 0 {
			b.WriteString(":" + strconv.Itoa(e.Line))
		}
		b.WriteString(": ")
	}
	if e.Field != "" {
		b.WriteString(e.Field + ": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

var (
	unknownFieldRE = regexp.MustCompile(`^line (\d+): field (\S+) not found in type \S+$`)
	lineMsgRE      = regexp.MustCompile(`^line (\d+): (.*)$`)
)

// parseConfig reads a config file's YAML strictly: an unknown field, a
// repeated one or a value of the wrong type is an error naming the field
// and its line. It does not apply defaults or validate.
func parseConfig(name string, data []byte) (*Config, error) {
	if len(data) > maxConfigBytes {
		return nil, &ConfigError{File: name, Msg: fmt.Sprintf("larger than %d bytes", maxConfigBytes)}
	}
	c := &Config{file: name}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		line, msg := splitYAMLError(err)
		return nil, &ConfigError{File: name, Line: line, Msg: msg}
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return c, nil // an empty file: every default
	}
	if root := doc.Content[0]; root.Kind != yaml.MappingNode {
		return nil, &ConfigError{File: name, Line: root.Line, Msg: "expected a mapping of fields at the top"}
	}
	c.doc = &doc
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(c); err != nil && !errors.Is(err, io.EOF) {
		return nil, c.yamlErr(err)
	}
	return c, nil
}

// splitYAMLError returns the line a yaml.v3 error names and its message.
func splitYAMLError(err error) (int, string) {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	if m := lineMsgRE.FindStringSubmatch(msg); m != nil {
		l, _ := strconv.Atoi(m[1])
		return l, m[2]
	}
	return 0, msg
}

// yamlErr turns a decoding error into ConfigErrors naming each field.
func (c *Config) yamlErr(err error) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		line, msg := splitYAMLError(err)
		return &ConfigError{File: c.file, Line: line, Field: c.pathAt(line), Msg: msg}
	}
	var errs []error
	for _, e := range te.Errors {
		if m := unknownFieldRE.FindStringSubmatch(e); m != nil {
			l, _ := strconv.Atoi(m[1])
			field := m[2]
			if p := c.parentAt(l); p != "" {
				field = p + "." + field
			}
			errs = append(errs, &ConfigError{File: c.file, Line: l, Field: field, Msg: "unknown field"})
			continue
		}
		line, msg := splitYAMLError(errors.New(e))
		errs = append(errs, &ConfigError{File: c.file, Line: line, Field: c.pathAt(line), Msg: msg})
	}
	return errors.Join(errs...)
}

// walk calls f with the dotted path of every mapping key in the document,
// the key node and its value.
func (c *Config) walk(f func(path string, k, v *yaml.Node)) {
	if c.doc == nil || len(c.doc.Content) == 0 {
		return
	}
	var rec func(n *yaml.Node, path string, depth int)
	rec = func(n *yaml.Node, path string, depth int) {
		if depth > 20 {
			return
		}
		switch n.Kind {
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				k, v := n.Content[i], n.Content[i+1]
				p := k.Value
				if path != "" {
					p = path + "." + k.Value
				}
				f(p, k, v)
				rec(v, p, depth+1)
			}
		case yaml.SequenceNode:
			for i, e := range n.Content {
				rec(e, path+"["+strconv.Itoa(i)+"]", depth+1)
			}
		}
	}
	rec(c.doc.Content[0], "", 0)
}

// pathAt is the path of the field whose key or scalar value is on line
// (the innermost), "" when none is.
func (c *Config) pathAt(line int) string {
	best := ""
	c.walk(func(path string, k, v *yaml.Node) {
		if k.Line == line || (v.Kind == yaml.ScalarNode && v.Line == line) {
			best = path
		}
		if v.Kind == yaml.SequenceNode {
			for i, e := range v.Content {
				if e.Kind == yaml.ScalarNode && e.Line == line {
					best = path + "[" + strconv.Itoa(i) + "]"
				}
			}
		}
	})
	return best
}

// parentAt is the path of the mapping that holds the key on line.
func (c *Config) parentAt(line int) string {
	best := ""
	c.walk(func(path string, k, v *yaml.Node) {
		if k.Line == line {
			if i := strings.LastIndexByte(path, '.'); i >= 0 {
				best = path[:i]
			} else {
				best = ""
			}
		}
	})
	return best
}

// lineOf is the line of the field at path in the file, 0 when it is not
// written there.
func (c *Config) lineOf(path string) int {
	line := 0
	c.walk(func(p string, k, v *yaml.Node) {
		if p == path {
			line = k.Line
		}
	})
	if line == 0 {
		// "a.b[2]": the list element's own line.
		if i := strings.LastIndexByte(path, '['); i > 0 && strings.HasSuffix(path, "]") {
			idx, err := strconv.Atoi(path[i+1 : len(path)-1])
			c.walk(func(p string, k, v *yaml.Node) {
				if p == path[:i] && err == nil && v.Kind == yaml.SequenceNode && idx < len(v.Content) {
					line = v.Content[idx].Line
				}
			})
		}
	}
	return line
}

// errf is a ConfigError about field: named by its flag when a flag set it,
// else by its path and line in the file.
func (c *Config) errf(field, format string, args ...any) *ConfigError {
	msg := fmt.Sprintf(format, args...)
	if flag, ok := c.flagged[field]; ok {
		return &ConfigError{Field: flag, Msg: msg}
	}
	return &ConfigError{File: c.file, Line: c.lineOf(field), Field: field, Msg: msg}
}

// Overrides are the command-line flags that override the config file.
type Overrides struct {
	Name, Region, Gossip, RPC, HTTP, RLS, Rules string
	Join                                        []string
}

// apply sets the overridden fields, remembering which flag set each.
func (c *Config) apply(o Overrides) {
	if c.flagged == nil {
		c.flagged = map[string]string{}
	}
	set := func(dst *string, v, field, flag string) {
		if v != "" {
			*dst = v
			c.flagged[field] = flag
		}
	}
	set(&c.Node.Name, o.Name, "node.name", "--name")
	set(&c.Node.Region, o.Region, "node.region", "--region")
	set(&c.Peer.RPC, o.RPC, "peer.rpc", "--rpc")
	set(&c.HTTP.Listen, o.HTTP, "http.listen", "--http")
	set(&c.Rules.File, o.Rules, "rules.file", "--rules")
	if o.Gossip != "" || len(o.Join) > 0 {
		if c.Gossip == nil {
			c.Gossip = &GossipSection{}
		}
		set(&c.Gossip.Bind, o.Gossip, "gossip.bind", "--gossip")
		if len(o.Join) > 0 {
			c.Gossip.Join = o.Join
			c.flagged["gossip.join"] = "--join"
		}
	}
	if o.RLS != "" {
		if c.Envoy == nil {
			c.Envoy = &EnvoySection{}
		}
		set(&c.Envoy.Listen, o.RLS, "envoy.listen", "--rls")
	}
}

// applyDefaults fills every empty field that has a default.
func (c *Config) applyDefaults() {
	if c.Node.Name == "" {
		c.Node.Name, _ = os.Hostname()
		if c.Node.Name == "" {
			c.Node.Name = "weir"
		}
	}
	if c.Node.Region == "" {
		c.Node.Region = defaultRegion
	}
	if c.Gossip != nil && c.Gossip.Bind == "" {
		c.Gossip.Bind = defaultGossip
	}
	if c.Peer.RPC == "" {
		c.Peer.RPC = defaultPeerRPC
	}
	if c.Envoy != nil && c.Envoy.Listen == "" {
		c.Envoy.Listen = defaultRLS
	}
	if c.HTTP.Listen == "" {
		c.HTTP.Listen = defaultHTTP
	}
	if l := c.Lease; l != nil {
		if v := l.Voter; v != nil {
			if v.Raft == "" {
				v.Raft = defaultRaft
			}
			if v.RPC == "" {
				v.RPC = defaultLeaseRPC
			}
		}
		if len(l.Regions) == 0 {
			l.Regions = []string{c.Node.Region}
		}
	}
	if c.AdminTokens.File == "" && c.AdminTokens.Env == "" {
		c.AdminTokens.Env = defaultTokensEnv
	}
	if c.Log.Level == "" {
		c.Log.Level = "info"
	}
	if c.Log.Format == "" {
		c.Log.Format = "text"
	}
	if c.Shutdown.Drain == 0 {
		c.Shutdown.Drain = 5 * time.Second
	}
}

// load reads one gossip key.
func (k KeySource) load() ([]byte, error) {
	var raw []byte
	switch {
	case (k.File == "") == (k.Base64 == ""):
		return nil, errors.New("set exactly one of file and base64")
	case k.File != "":
		if err := regularFile(k.File); err != nil {
			return nil, err
		}
		b, err := os.ReadFile(k.File)
		if err != nil {
			return nil, err
		}
		if raw, err = keyfile.Decode(b); err != nil {
			return nil, fmt.Errorf("%s: %w", k.File, err)
		}
	default:
		d, err := base64.StdEncoding.DecodeString(strings.TrimSpace(k.Base64))
		if err != nil {
			return nil, fmt.Errorf("base64: %v", err)
		}
		raw = d
	}
	if !keyfile.ValidLen(len(raw)) {
		return nil, fmt.Errorf("a gossip key is 16, 24 or 32 bytes, got %d", len(raw))
	}
	return raw, nil
}

// regularFile checks that path is a regular file of at most 16 MiB, so
// that no config makes the daemon read a device or a FIFO.
func regularFile(path string) error {
	fi, err := os.Stat(path)
	switch {
	case err != nil:
		return err
	case !fi.Mode().IsRegular():
		return fmt.Errorf("%s: not a regular file", path)
	case fi.Size() > 16<<20:
		return fmt.Errorf("%s: larger than 16 MiB", path)
	}
	return nil
}

// tokens reads the rules API's bearer tokens: token → principal.
func (c *Config) tokens(getenv func(string) string) (map[string]string, error) {
	out := map[string]string{}
	if c.AdminTokens.File != "" {
		if err := regularFile(c.AdminTokens.File); err != nil {
			return nil, c.errf("admin_tokens.file", "%v", err)
		}
		b, err := os.ReadFile(c.AdminTokens.File)
		if err != nil {
			return nil, c.errf("admin_tokens.file", "%v", err)
		}
		if err := parseTokens(string(b), out); err != nil {
			return nil, c.errf("admin_tokens.file", "%s: %v", c.AdminTokens.File, err)
		}
	}
	if c.AdminTokens.Env != "" {
		if err := parseTokens(getenv(c.AdminTokens.Env), out); err != nil {
			return nil, c.errf("admin_tokens.env", "$%s: %v", c.AdminTokens.Env, err)
		}
	}
	return out, nil
}

// minTokenBytes is the shortest bearer token accepted (raftgroup.AdminHandler
// refuses shorter ones too).
const minTokenBytes = 16

// parseTokens reads "principal:token" entries, one a line or separated by
// commas; blank lines and lines starting with # are skipped. The token is
// everything after the first colon. It adds each to out (token →
// principal); the error names the entry's position, never the token.
func parseTokens(s string, out map[string]string) error {
	// Errors name entries by number only: a principal and a token written
	// the wrong way round would otherwise put the token in a log.
	n := 0
	for line := range strings.Lines(s) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		for ent := range strings.SplitSeq(line, ",") {
			ent = strings.TrimSpace(ent)
			if ent == "" {
				continue
			}
			n++
			principal, token, ok := strings.Cut(ent, ":")
			principal, token = strings.TrimSpace(principal), strings.TrimSpace(token)
			switch {
			case !ok:
				return fmt.Errorf("entry %d: want principal:token", n)
			case principal == "":
				return fmt.Errorf("entry %d: empty principal", n)
			case len(token) < minTokenBytes:
				return fmt.Errorf("entry %d: the token is shorter than %d bytes", n, minTokenBytes)
			}
			if p, dup := out[token]; dup && p != principal {
				// It may come from the other source (file or environment).
				return fmt.Errorf("entry %d: the same token is already given to another principal", n)
			}
			out[token] = principal
		}
	}
	return nil
}

// serverTLS builds a server's TLS config from files: with a CA, client
// certificates are verified (required when requireClient).
func serverTLS(t *TLSFiles, requireClient bool) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(t.Cert, t.Key)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if t.CA != "" {
		pool, err := keyfile.CertPool(t.CA)
		if err != nil {
			return nil, err
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.VerifyClientCertIfGiven
		if requireClient {
			cfg.ClientAuth = tls.RequireAndVerifyClientCert
		}
	}
	return cfg, nil
}

// clientTLS builds a client's TLS config from files: the CA verifies the
// server; cert and key, when set, are the client's certificate.
func clientTLS(t *TLSFiles) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if t.Cert != "" || t.Key != "" {
		cert, err := tls.LoadX509KeyPair(t.Cert, t.Key)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	if t.CA != "" {
		pool, err := keyfile.CertPool(t.CA)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}

// loadConfig reads the config file (none when path is empty), applies the
// overrides and the defaults and validates the result.
func loadConfig(path string, o Overrides) (*Config, error) {
	c := &Config{}
	if path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("--config: %w", err)
		}
		if c, err = parseConfig(path, data); err != nil {
			return nil, err
		}
	}
	c.apply(o)
	c.applyDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	return c, nil
}

package main

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testFiles writes a rules file, an envoy descriptor file, a gossip key
// and a tokens file into a temporary folder and returns their paths.
func testFiles(t testing.TB) (dir string) {
	dir = t.TempDir()
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("rules.yaml", "rules:\n  - id: per-key\n    key: [header:X-API-Key]\n    limit: 100\n    window: 1m\n")
	write("edge.yaml", "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: minute, requests_per_unit: 100}\n")
	write("gossip.key", base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))+"\n")
	write("tokens", "# operators\nalice:0123456789abcdef0123\nbob:fedcba9876543210fedc\n")
	return dir
}

func TestConfigGood(t *testing.T) {
	dir := testFiles(t)
	in := `
node: {name: n1, region: eu}
gossip:
  bind: 127.0.0.1:0
  join: [127.0.0.1:7946]
  keys:
    - file: ` + filepath.Join(dir, "gossip.key") + `
    - base64: ` + base64.StdEncoding.EncodeToString([]byte("abcdefghijklmnop")) + `
  local_timing: true
peer: {rpc: 127.0.0.1:0, sync_interval: 2s, decide_timeout: 1s}
envoy:
  listen: 127.0.0.1:0
  descriptors: [` + filepath.Join(dir, "edge.yaml") + `]
lease:
  voter: {data_dir: ` + filepath.Join(dir, "data") + `, raft: 127.0.0.1:0, rpc: 127.0.0.1:0}
  regions: [eu, us]
http: {listen: 127.0.0.1:0}
admin_tokens: {file: ` + filepath.Join(dir, "tokens") + `}
trusted_proxies: [10.0.0.0/8]
max_keys: 1000
canary: {rule: envoy.edge.api_key, interval: 100ms}
log: {level: warn, format: json}
`
	c, err := parseConfig("weir.yaml", []byte(in))
	if err != nil {
		t.Fatal(err)
	}
	c.apply(Overrides{Name: "n9", HTTP: "127.0.0.1:0"})
	c.applyDefaults()
	if err := c.validate(); err != nil {
		t.Fatal(err)
	}
	if c.Node.Name != "n9" || c.Node.Region != "eu" || c.Peer.SyncInterval != 2*time.Second || c.Envoy.Listen != "127.0.0.1:0" {
		t.Fatalf("parsed %+v", c)
	}
	if len(c.Gossip.Keys) != 2 || c.Lease.Voter.DataDir == "" || c.Canary.Interval != 100*time.Millisecond {
		t.Fatalf("parsed %+v", c)
	}
	toks, err := c.tokens(func(string) string { return "" })
	if err != nil || len(toks) != 2 || toks["0123456789abcdef0123"] != "alice" {
		t.Fatalf("tokens %v, %v", toks, err)
	}
	for i, k := range c.Gossip.Keys {
		if b, err := k.load(); err != nil || len(b) != []int{32, 16}[i] {
			t.Fatalf("key %d: %d bytes, %v", i, len(b), err)
		}
	}
	ec, err := c.envoyConfig()
	if err != nil || len(ec.Rules()) != 1 {
		t.Fatalf("envoy config: %v", err)
	}
}

// TestConfigNoFile is `weir serve --rules rules.yaml`: no config file, a
// single local node on the default loopback addresses.
func TestConfigNoFile(t *testing.T) {
	dir := testFiles(t)
	c, err := loadConfig("", Overrides{Rules: filepath.Join(dir, "rules.yaml")})
	if err != nil {
		t.Fatal(err)
	}
	if c.Gossip != nil || c.Lease != nil || c.Envoy != nil || c.HTTP.Listen != defaultHTTP {
		t.Fatalf("defaults: %+v", c)
	}
}

func TestConfigErrors(t *testing.T) {
	dir := testFiles(t)
	rules := "rules: {file: " + filepath.Join(dir, "rules.yaml") + "}\n"
	cases := []struct {
		name, in string
		o        Overrides
		want     []string // substrings of the error
	}{
		{"unknown top field", rules + "nodes: {name: x}\n", Overrides{}, []string{"weir.yaml:2", "nodes", "unknown field"}},
		{"unknown nested field", rules + "gossip:\n  bind: 127.0.0.1:0\n  jion: [x]\n", Overrides{}, []string{"weir.yaml:4", "gossip.jion", "unknown field"}},
		{"wrong type", rules + "max_keys: lots\n", Overrides{}, []string{"weir.yaml:2", "max_keys"}},
		{"bad duration", rules + "peer: {sync_interval: soon}\n", Overrides{}, []string{"weir.yaml:2", "peer.sync_interval"}},
		{"duplicate field", rules + "max_keys: 1\nmax_keys: 2\n", Overrides{}, []string{"weir.yaml:3", "already defined"}},
		{"syntax", rules + "node: [\n", Overrides{}, []string{"weir.yaml:"}},
		{"not a mapping", "- a\n- b\n", Overrides{}, []string{"weir.yaml:1", "mapping"}},
		{"no rules", "node: {name: a}\n", Overrides{}, []string{"rules: no rules"}},
		{"two rule sources", rules + "envoy: {descriptors: [" + filepath.Join(dir, "edge.yaml") + "]}\n", Overrides{}, []string{"rules:", "exclusive"}},
		{"rules file missing", "rules: {file: " + filepath.Join(dir, "nope.yaml") + "}\n", Overrides{}, []string{"weir.yaml:1", "rules.file", "no such file"}},
		{"bad address", rules + "http: {listen: localhost}\n", Overrides{}, []string{"weir.yaml:2", "http.listen", "host:port"}},
		{"bad address flag", rules, Overrides{HTTP: "nowhere"}, []string{"--http", "host:port"}},
		{"bad join", rules + "gossip:\n  join: [a, 'b:1']\n", Overrides{}, []string{"gossip.join[0]", "host:port"}},
		{"negative duration", rules + "peer: {decide_timeout: -1s}\n", Overrides{}, []string{"peer.decide_timeout", "negative"}},
		{"bad key", rules + "gossip: {keys: [{base64: c2hvcnQ=}]}\n", Overrides{}, []string{"gossip.keys[0]", "16, 24 or 32"}},
		{"key both", rules + "gossip: {keys: [{base64: x, file: y}]}\n", Overrides{}, []string{"gossip.keys[0]", "exactly one"}},
		{"peer tls without cluster", rules + "peer: {tls: {cert: a, key: b, ca: c}}\n", Overrides{}, []string{"peer.tls", "without a cluster"}},
		{"peer tls files", rules + "gossip: {}\npeer: {tls: {cert: " + filepath.Join(dir, "none.pem") + "}}\n", Overrides{}, []string{"peer.tls.cert", "peer.tls.key: required", "peer.tls.ca: required"}},
		{"lease both", rules + "lease: {voter: {data_dir: d}, voters: ['a:1']}\n", Overrides{}, []string{"lease:", "exactly one"}},
		{"lease voter data dir", rules + "lease: {voter: {}}\n", Overrides{}, []string{"lease.voter.data_dir: required"}},
		{"lease voters without self", rules + "node: {name: n1}\nlease:\n  voter:\n    data_dir: d\n    voters: [{name: n2, raft: 'a:1', rpc: 'a:2'}]\n", Overrides{}, []string{"lease.voter.voters", "this node"}},
		{"lease voter count", rules + "node: {name: n1}\nlease:\n  voter:\n    data_dir: d\n    voters: [{name: n1, raft: 'a:1', rpc: 'a:2'}, {name: n2, raft: 'b:1', rpc: 'b:2'}]\n", Overrides{}, []string{"1, 3 or 5"}},
		{"lease regions", rules + "node: {region: eu}\nlease: {voters: ['a:1'], regions: [us]}\n", Overrides{}, []string{"lease.regions", "\"eu\""}},
		{"rules lease without lease", "rules: {lease: true}\n", Overrides{}, []string{"rules.lease", "lease section"}},
		{"envoy without descriptors", "envoy: {listen: '127.0.0.1:0'}\n", Overrides{}, []string{"envoy.descriptors: required"}},
		{"envoy bad file", "envoy: {descriptors: [" + filepath.Join(dir, "rules.yaml") + "]}\n", Overrides{}, []string{"envoy.descriptors[0]"}},
		{"envoy mode", "envoy: {descriptors: [" + filepath.Join(dir, "edge.yaml") + "], mode: fast}\n", Overrides{}, []string{"envoy.mode", "fast"}},
		{"envoy fixed window in shared mode", "envoy: {descriptors: [" + filepath.Join(dir, "edge.yaml") + "], mode: shared, fixed_window: true}\n", Overrides{}, []string{"envoy.fixed_window", "exact mode"}},
		{"envoy fidelity in shared mode", "envoy: {descriptors: [" + filepath.Join(dir, "edge.yaml") + "], mode: shared, fidelity: true}\n", Overrides{}, []string{"envoy.fidelity", "exact mode"}},
		{"envoy response headers", "envoy: {descriptors: [" + filepath.Join(dir, "edge.yaml") + "], response_headers: all}\n", Overrides{}, []string{"envoy.response_headers", "weir, none or envoy", "\"all\""}},
		{"envoy two files of a domain", "envoy: {descriptors: [" + filepath.Join(dir, "edge.yaml") + ", " + filepath.Join(dir, "edge.yaml") + "]}\n", Overrides{}, []string{"duplicate domain"}},
		{"max keys", rules + "max_keys: -1\n", Overrides{}, []string{"max_keys", "negative"}},
		{"tokens file missing", rules + "admin_tokens: {file: " + filepath.Join(dir, "nope") + "}\n", Overrides{}, []string{"admin_tokens.file"}},
		{"tokens not a file", rules + "admin_tokens: {file: " + dir + "}\n", Overrides{}, []string{"admin_tokens.file", "not a regular file"}},
		{"canary rule", rules + "canary: {interval: 1s}\n", Overrides{}, []string{"canary.rule: required"}},
		{"log level", rules + "log: {level: loud}\n", Overrides{}, []string{"weir.yaml:2", "log.level", "loud"}},
		{"node name", rules + "node: {name: 'a b'}\n", Overrides{}, []string{"node.name", "spaces"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := parseConfig("weir.yaml", []byte(tc.in))
			if err == nil {
				c.apply(tc.o)
				c.applyDefaults()
				err = c.validate()
			}
			if err == nil {
				t.Fatalf("no error for\n%s", tc.in)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestParseTokens(t *testing.T) {
	good := "alice:0123456789abcdef, bob:0123456789abcdeg:with:colons\n\n# c\ncarol : 0123456789abcdeh \n"
	out := map[string]string{}
	if err := parseTokens(good, out); err != nil {
		t.Fatal(err)
	}
	if len(out) != 3 || out["0123456789abcdeg:with:colons"] != "bob" || out["0123456789abcdeh"] != "carol" {
		t.Fatalf("got %v", out)
	}
	for _, bad := range []string{"alice", ":0123456789abcdef", "alice:short", "a:0123456789abcdef,b:0123456789abcdef"} {
		err := parseTokens(bad, map[string]string{})
		if err == nil {
			t.Errorf("%q: no error", bad)
			continue
		}
		if strings.Contains(err.Error(), "0123456789") {
			t.Errorf("%q: the error shows the token: %v", bad, err)
		}
	}
}

// FuzzConfig checks that no config file makes the parser or the validator
// panic, and that every refusal says where (a file name or a field).
func FuzzConfig(f *testing.F) {
	seeds := []string{
		"",
		"node: {name: n1, region: eu}\nrules: {file: rules.yaml}\n",
		"gossip:\n  bind: 127.0.0.1:0\n  join: [a:1]\n  keys: [{base64: MDEyMzQ1Njc4OWFiY2RlZg==}]\n",
		"lease:\n  voter: {data_dir: d, voters: [{name: n1, raft: 'a:1', rpc: 'a:2'}]}\n",
		"envoy: {listen: ':8081', descriptors: [a.yaml], mode: exact, accuracy: 0.1}\n",
		"peer: {sync_interval: 1s, tls: {cert: a, key: b, ca: c}}\n",
		"max_keys: -1\nlog: {level: x}\n",
		"a: &x [*x]\n",
		"node: [\n",
		"- 1\n",
		"node: {name: !!binary aGk=}\n",
		"x: y\nx: z\n",
	}
	for _, s := range seeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		c, err := parseConfig("fuzz.yaml", []byte(in))
		if err != nil {
			if !strings.Contains(err.Error(), "fuzz.yaml") {
				t.Fatalf("error without the file name: %v", err)
			}
			return
		}
		c.applyDefaults()
		_ = c.validate()
	})
}

// FuzzParseTokens checks that no tokens text panics the parser, that every
// token it accepts is long enough and has a principal, and that its
// errors never show a token.
func FuzzParseTokens(f *testing.F) {
	for _, s := range []string{"", "alice:0123456789abcdef", "a:0123456789abcdef,b:fedcba9876543210\n# x\n", "alice", ":x", "a:short",
		"a:0123456789abcdef\na:0123456789abcdef", "b:0123456789abcdef\na:0123456789abcdef"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		out := map[string]string{}
		if err := parseTokens(in, out); err != nil {
			for tok := range out {
				if strings.Contains(err.Error(), tok) {
					t.Fatalf("the error shows a token: %v", err)
				}
			}
			return
		}
		for tok, p := range out {
			if len(tok) < minTokenBytes || p == "" {
				t.Fatalf("accepted %q for %q", tok, p)
			}
		}
	})
}

// FuzzRuleJSON checks that no rule file panics the YAML-to-JSON step and
// that what it accepts is a JSON object.
func FuzzRuleJSON(f *testing.F) {
	for _, s := range []string{"limit: 100\nwindow: 1m\n", `{"limit": 10, "window": "1s"}`, "- a\n", "", "a: &x [*x]\n", "1: 2\n", "a: {b: [1, 2]}\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		b, err := ruleJSON("rule.yaml", []byte(in))
		if err != nil {
			return
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("not a JSON object: %s", b)
		}
	})
}

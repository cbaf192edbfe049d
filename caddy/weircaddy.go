// Package weircaddy is a Caddy module that rate-limits requests with an
// embedded weir node: the HTTP handler http.handlers.weir and the Caddyfile
// directive weir.
//
// Each handler names a node (Handler.ID); the node lives across Caddy's
// config reloads, so buckets and cluster membership survive them: a reload
// that keeps the node's rules file, cluster, lease and identity cap keeps
// the node and puts the new inline rules in force with SetRules; a reload
// that changes them closes the old node (it leaves the ring, handing its
// buckets off) and starts a new one that joins again. Nodes change only
// when Caddy puts the new config in force (App): a reload that Caddy
// refuses leaves the running nodes as they were. The identities of the
// rules' key sources come from Caddy: "ip" is {http.vars.client_ip}
// (Caddy's trusted_proxies decide it), "user" is {http.auth.user.id}, and
// header sources read the request's header, each in the namespace of its
// source. A rejected request is answered as weir's net/http middleware
// answers it (429, Retry-After, the rate-limit headers, an
// application/problem+json body), or handed to Caddy's handle_errors routes
// with HandleErrors.
package weircaddy

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/hashicorp/memberlist"
	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/keyfile"
	"github.com/weir-dev/weir/quota"
)

func init() {
	caddy.RegisterModule(new(Handler))
}

// Handler is the http.handlers.weir module: it decides every request with a
// weir node before passing it to the next handler.
type Handler struct {
	// ID names the node this handler decides with, so that handlers in
	// several routes (or several configs over reloads) share one node.
	// Default "default".
	ID string `json:"id,omitempty"`

	// Rules are the node's rules inline, in the rules file's YAML format
	// (docs/rules.md). Exclusive with RulesFile.
	Rules string `json:"rules,omitempty"`

	// RulesFile is a rules file the node watches: a valid change takes
	// effect within about a second, an invalid one is logged and ignored.
	RulesFile string `json:"rules_file,omitempty"`

	// User is the placeholder whose value is the identity of "user" key
	// sources. Default "{http.auth.user.id}". A placeholder with no value
	// (no authenticated user) is empty, as for the other placeholders.
	User string `json:"user,omitempty"`

	// Tier is the placeholder whose value selects a rule's tier. Empty
	// means no tier.
	Tier string `json:"tier,omitempty"`

	// ClientIP is the placeholder whose value is the identity of "ip" key
	// sources. Default "{http.vars.client_ip}" (the Caddyfile's
	// {client_ip}), which Caddy's
	// trusted_proxies decide.
	ClientIP string `json:"client_ip,omitempty"`

	// HandleErrors hands a rejection to Caddy's error routes (handle_errors)
	// as an error with status 429 (400 for an identity over the cap), with
	// the rate-limit headers already set, instead of answering it.
	HandleErrors bool `json:"handle_errors,omitempty"`

	// MaxIdentityBytes caps an identity's length (weir.Config); zero means
	// weir's default.
	MaxIdentityBytes int `json:"max_identity_bytes,omitempty"`

	// Cluster makes the node a member of its region's weir cluster. Nil:
	// the node decides every rule alone.
	Cluster *Cluster `json:"cluster,omitempty"`

	// Lease connects the node to a weir lease group as a client. Nil: no
	// lease group (and durable rules are refused).
	Lease *Lease `json:"lease,omitempty"`

	entry                *entry
	rules                []quota.Rule
	clientIP, user, tier placeholder
	needs                atomic.Pointer[needs]
}

// Cluster is the node's cluster membership (weir.ClusterConfig).
type Cluster struct {
	// Name is the node's name, unique in the cluster. Required.
	Name string `json:"name,omitempty"`
	// Region is the node's region. Default "local".
	Region string `json:"region,omitempty"`
	// Gossip is the memberlist address, host:port; port 0 picks a free one.
	// Default "127.0.0.1:0".
	Gossip string `json:"gossip,omitempty"`
	// Advertise is the gossip address other members reach, when it differs.
	Advertise string `json:"advertise,omitempty"`
	// RPC is the peer gRPC address, host:port. Default "127.0.0.1:0".
	RPC string `json:"rpc,omitempty"`
	// Join lists gossip addresses of members to join; empty starts a
	// cluster.
	Join []string `json:"join,omitempty"`
	// Label isolates clusters that share a network.
	Label string `json:"label,omitempty"`
	// LocalTiming selects failure detection tuned for one machine.
	LocalTiming bool `json:"local_timing,omitempty"`
	// KeyFiles hold the gossip keys (raw 16, 24 or 32 bytes, or their
	// base64); the first encrypts, the others are accepted too (rotation).
	KeyFiles []string `json:"key_files,omitempty"`
	// TLS secures peer RPC with mutual TLS.
	TLS *TLSFiles `json:"tls,omitempty"`
}

// Lease is the node's connection to a lease group, as a client of its
// voters (weir.LeaseConfig).
type Lease struct {
	// Voters are the lease RPC addresses of the group's voters. Required.
	Voters []string `json:"voters,omitempty"`
	// Rules makes the group the node's only source of rules (the rules
	// API, docs/rules-api.md). The handler's inline rules are then the
	// defaults enforced until the group's first rule set arrives, and
	// rules_file must be empty.
	Rules bool `json:"rules,omitempty"`
	// CheckInterval is how often the node asks the group for its rule
	// version. Default 5s.
	CheckInterval caddy.Duration `json:"check_interval,omitempty"`
	// TLS secures the calls to the voters with mutual TLS.
	TLS *TLSFiles `json:"tls,omitempty"`
}

// TLSFiles names PEM files: this node's certificate and key, and the CA
// that verifies its peers.
type TLSFiles struct {
	Cert string `json:"cert,omitempty"`
	Key  string `json:"key,omitempty"`
	CA   string `json:"ca,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (*Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.weir",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision parses the rules, reads the cluster's key and TLS files, and
// hands the node's settings to the config's weir app, which puts them in
// force when Caddy starts the config (App).
func (h *Handler) Provision(ctx caddy.Context) error {
	if h.ID == "" {
		h.ID = "default"
	}
	if h.User == "" {
		h.User = "{http.auth.user.id}"
	}
	if h.ClientIP == "" {
		h.ClientIP = "{http.vars.client_ip}"
	}
	h.clientIP, h.user, h.tier = compile(h.ClientIP), compile(h.User), compile(h.Tier)
	leaseRules := h.Lease != nil && h.Lease.Rules
	switch {
	case h.Rules != "" && h.RulesFile != "":
		return errors.New("weir: rules and rules_file are exclusive")
	case leaseRules && h.RulesFile != "":
		return errors.New("weir: lease rules and rules_file are exclusive: with lease rules the group is the source of rules (inline rules are the defaults until its rules arrive)")
	case h.Rules == "" && h.RulesFile == "" && !leaseRules:
		return errors.New("weir: no rules: set rules, rules_file, or lease rules")
	case h.Rules != "":
		rules, err := quota.Parse("rules", []byte(h.Rules))
		if err != nil {
			return fmt.Errorf("weir: rules: %w", err)
		}
		if _, err := quota.NewSet(rules, 1); err != nil {
			return fmt.Errorf("weir: rules: %w", err)
		}
		for _, r := range rules {
			if r.Durable && h.Lease == nil {
				return fmt.Errorf("weir: rules: rule %q is durable, which needs a lease group: configure lease", r.ID)
			}
		}
		h.rules = rules
	}
	key, err := json.Marshal(struct {
		RulesFile string
		MaxID     int
		Cluster   *Cluster
		Lease     *Lease
		Defaults  string
	}{h.RulesFile, h.MaxIdentityBytes, h.Cluster, h.Lease, defaultsText(h)})
	if err != nil {
		return err
	}
	cfg, err := h.nodeConfig(ctx)
	if err != nil {
		return fmt.Errorf("weir %q: %w", h.ID, err)
	}
	app, err := ctx.App("weir")
	if err != nil {
		return err
	}
	w := &want{id: h.ID, key: string(key), rulesText: h.Rules, rules: h.rules, cfg: cfg}
	if leaseRules {
		// The group's rules are in force: the defaults are part of the key.
		w.rulesText, w.rules = "", nil
	}
	e, err := app.(*App).use(w)
	if err != nil {
		return err
	}
	h.entry = e
	return nil
}

// nodeConfig is the config of the node the handler's settings describe.
func (h *Handler) nodeConfig(ctx caddy.Context) (weir.Config, error) {
	cfg := weir.Config{
		Rules:            h.rules,
		RulesFile:        h.RulesFile,
		MaxIdentityBytes: h.MaxIdentityBytes,
		Logger:           ctx.Slogger(),
	}
	if c := h.Cluster; c != nil {
		cc, err := c.config()
		if err != nil {
			return weir.Config{}, err
		}
		cfg.Cluster = cc
	}
	if l := h.Lease; l != nil {
		if len(l.Voters) == 0 {
			return weir.Config{}, errors.New("lease: voters are required")
		}
		if l.CheckInterval < 0 {
			return weir.Config{}, fmt.Errorf("lease: check_interval: must not be negative, got %v", time.Duration(l.CheckInterval))
		}
		lc := &weir.LeaseConfig{Voters: l.Voters, Rules: l.Rules, CheckInterval: time.Duration(l.CheckInterval)}
		if l.TLS != nil {
			_, cli, err := l.TLS.configs()
			if err != nil {
				return weir.Config{}, fmt.Errorf("lease: tls: %w", err)
			}
			lc.ClientTLS = cli
		}
		cfg.Lease = lc
		if l.Rules {
			cfg.Rules, cfg.DefaultRules = nil, h.rules
		}
	}
	return cfg, nil
}

// defaultsText is the handler's inline rules when they are the defaults of
// lease rules, which a kept node cannot change.
func defaultsText(h *Handler) string {
	if h.Lease != nil && h.Lease.Rules {
		return h.Rules
	}
	return ""
}

// config builds the weir cluster config, reading the key and TLS files.
func (c *Cluster) config() (*weir.ClusterConfig, error) {
	if c.Name == "" {
		return nil, errors.New("cluster: name is required")
	}
	cc := &weir.ClusterConfig{
		Name: c.Name, Region: c.Region, GossipAddr: c.Gossip, AdvertiseAddr: c.Advertise,
		RPCAddr: c.RPC, Join: c.Join, Label: c.Label, LocalTiming: c.LocalTiming,
	}
	if cc.Region == "" {
		cc.Region = "local"
	}
	var keys [][]byte
	for _, f := range c.KeyFiles {
		k, err := readKey(f)
		if err != nil {
			return nil, fmt.Errorf("cluster: key_file %s: %w", f, err)
		}
		keys = append(keys, k)
	}
	if len(keys) > 0 {
		kr, err := memberlist.NewKeyring(keys[1:], keys[0])
		if err != nil {
			return nil, fmt.Errorf("cluster: key_file: %w", err)
		}
		cc.Keyring = kr
	}
	if t := c.TLS; t != nil {
		srv, cli, err := t.configs()
		if err != nil {
			return nil, fmt.Errorf("cluster: tls: %w", err)
		}
		cc.ServerTLS, cc.ClientTLS = srv, cli
	}
	return cc, nil
}

// readKey reads a gossip key file: raw 16, 24 or 32 bytes, or their base64.
func readKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return keyfile.Decode(b)
}

// configs builds mutual-TLS configs for the peer RPC server and client.
func (t *TLSFiles) configs() (server, client *tls.Config, err error) {
	cert, err := tls.LoadX509KeyPair(t.Cert, t.Key)
	if err != nil {
		return nil, nil, err
	}
	pool, err := keyfile.CertPool(t.CA)
	if err != nil {
		return nil, nil, err
	}
	server = &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool,
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}
	client = &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS12}
	return server, client, nil
}

// ServeHTTP decides the request, answers or hands over a rejection, and
// otherwise sets the rate-limit headers and calls next.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	n := h.entry.node.Load()
	if n == nil {
		// The config's weir app has not started the node yet: Caddy starts
		// the http app and the weir app of a new config one after the other.
		select {
		case <-h.entry.ready:
		case <-r.Context().Done():
			return r.Context().Err()
		}
		if n = h.entry.node.Load(); n == nil {
			return caddyhttp.Error(http.StatusServiceUnavailable, fmt.Errorf("weir %q: no node: its config did not start", h.ID))
		}
	}
	req := weir.Request{Method: r.Method, Path: weir.CleanPath(r.URL.Path), Header: r.Header}
	// Only the attributes some rule in force reads are resolved.
	if need := h.needsOf(n.Rules()); need.ip || need.user || need.tier {
		repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
		if need.ip {
			req.ClientIP = h.clientIP.value(r, repl)
		}
		if need.user {
			req.User = h.user.value(r, repl)
		}
		if need.tier {
			req.Tier = h.tier.value(r, repl)
		}
	}
	d := n.Allow(r.Context(), req)
	defer d.Done()
	if d.Err != nil || !d.Allowed {
		if !h.HandleErrors {
			weir.WriteRejection(w, &d)
			return nil
		}
		d.WriteHeaders(w.Header())
		if d.Err != nil {
			return caddyhttp.Error(http.StatusBadRequest, d.Err)
		}
		return caddyhttp.Error(http.StatusTooManyRequests, errRateLimited)
	}
	d.WriteHeaders(w.Header())
	if d.Delay > 0 {
		t := time.NewTimer(d.Delay)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return r.Context().Err()
		}
	}
	return next.ServeHTTP(w, r)
}

// needs says which request attributes the rules of a set read.
type needs struct {
	set            *quota.Set
	ip, user, tier bool
}

// needsOf returns what the rules of set read, computed once per set.
func (h *Handler) needsOf(set *quota.Set) needs {
	if c := h.needs.Load(); c != nil && c.set == set {
		return *c
	}
	c := &needs{set: set}
	for i := range set.Len() {
		r := set.Rule(i)
		for _, k := range r.Key {
			c.ip = c.ip || k.Kind == quota.KeyIP
			c.user = c.user || k.Kind == quota.KeyUser
		}
		c.tier = c.tier || len(r.Tiers) > 0
	}
	h.needs.Store(c)
	return *c
}

// placeholder is a handler setting that Caddy's replacer resolves per
// request: a text with placeholders, or (the usual case, resolved without
// parsing the text) one placeholder alone.
type placeholder struct {
	text string
	key  string // the placeholder's name when text is one placeholder alone
}

func compile(text string) placeholder {
	p := placeholder{text: text}
	if len(text) > 2 && text[0] == '{' && text[len(text)-1] == '}' && !strings.ContainsAny(text[1:len(text)-1], "{}\\") {
		p.key = text[1 : len(text)-1]
	}
	return p
}

// value is the placeholder's value for r; empty when it has none.
func (p placeholder) value(r *http.Request, repl *caddy.Replacer) string {
	switch {
	case p.text == "":
		return ""
	case p.key == "http.vars.client_ip":
		if ip, ok := caddyhttp.GetVar(r.Context(), caddyhttp.ClientIPVarKey).(string); ok {
			return ip
		}
	}
	if repl == nil {
		return ""
	}
	if p.key != "" {
		v, _ := repl.GetString(p.key)
		return v
	}
	return repl.ReplaceAll(p.text, "")
}

// errRateLimited is the error a rejection hands to handle_errors.
var errRateLimited = errors.New("rate limit exceeded")

// Node returns the running node named id, for the operator's views of
// package ops (ops.Status, ops.Members, ops.GossipAddr). ok is false when no
// config in force has a handler with that id.
func Node(id string) (n *weir.Node, ok bool) {
	nodes.mu.Lock()
	defer nodes.mu.Unlock()
	e, ok := nodes.m[id]
	if !ok || e.node.Load() == nil {
		return nil, false
	}
	return e.node.Load(), true
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)

// Package weircaddy is a Caddy module that rate-limits requests with an
// embedded weir node: the HTTP handler http.handlers.weir and the Caddyfile
// directive weir.
//
// Each handler names a node (Handler.ID); the node lives across Caddy's
// config reloads, so buckets and cluster membership survive them: a reload
// that keeps the node's rules file, cluster settings and identity cap keeps
// the node and puts the new inline rules in force with SetRules; a reload
// that changes them closes the old node (it leaves the ring, handing its
// buckets off) and starts a new one that joins again. The identities of the
// rules' key sources come from Caddy: "ip" is {http.request.client_ip}
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
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/hashicorp/memberlist"
	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/keyfile"
	"github.com/weir-dev/weir/quota"
)

func init() {
	caddy.RegisterModule(Handler{})
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
	// sources. Default "{http.request.client_ip}", which Caddy's
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

	entry *entry
	rules []quota.Rule
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

// TLSFiles names PEM files: this node's certificate and key, and the CA
// that verifies its peers.
type TLSFiles struct {
	Cert string `json:"cert,omitempty"`
	Key  string `json:"key,omitempty"`
	CA   string `json:"ca,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.weir",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision parses the rules and takes the handler's node from the nodes
// that outlive reloads, starting it when it is new or its settings changed.
func (h *Handler) Provision(ctx caddy.Context) error {
	if h.ID == "" {
		h.ID = "default"
	}
	if h.User == "" {
		h.User = "{http.auth.user.id}"
	}
	if h.ClientIP == "" {
		h.ClientIP = "{http.request.client_ip}"
	}
	switch {
	case h.Rules != "" && h.RulesFile != "":
		return errors.New("weir: rules and rules_file are exclusive")
	case h.Rules == "" && h.RulesFile == "":
		return errors.New("weir: no rules: set rules or rules_file")
	case h.Rules != "":
		rules, err := quota.Parse("rules", []byte(h.Rules))
		if err != nil {
			return fmt.Errorf("weir: rules: %w", err)
		}
		h.rules = rules
	}
	key, err := json.Marshal(struct {
		RulesFile string
		MaxID     int
		Cluster   *Cluster
	}{h.RulesFile, h.MaxIdentityBytes, h.Cluster})
	if err != nil {
		return err
	}
	e, err := nodes.acquire(h.ID, string(key), h.rules, func() (*weir.Node, error) {
		return h.newNode(ctx)
	})
	if err != nil {
		return fmt.Errorf("weir %q: %w", h.ID, err)
	}
	h.entry = e
	return nil
}

// newNode starts the node the handler's settings describe.
func (h *Handler) newNode(ctx caddy.Context) (*weir.Node, error) {
	cfg := weir.Config{
		Rules:            h.rules,
		RulesFile:        h.RulesFile,
		MaxIdentityBytes: h.MaxIdentityBytes,
		Logger:           ctx.Slogger(),
	}
	if c := h.Cluster; c != nil {
		cc, err := c.config()
		if err != nil {
			return nil, err
		}
		cfg.Cluster = cc
	}
	return weir.New(cfg)
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

// Cleanup lets go of the handler's node; the node closes when no config in
// force uses it.
func (h *Handler) Cleanup() error {
	if h.entry != nil {
		nodes.release(h.entry)
	}
	return nil
}

// ServeHTTP decides the request, answers or hands over a rejection, and
// otherwise sets the rate-limit headers and calls next.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	n := h.entry.node
	repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	req := n.RequestFromHTTP(r)
	if repl != nil {
		req.ClientIP = repl.ReplaceAll(h.ClientIP, "")
		req.User = repl.ReplaceAll(h.User, "")
		if h.Tier != "" {
			req.Tier = repl.ReplaceAll(h.Tier, "")
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

// errRateLimited is the error a rejection hands to handle_errors.
var errRateLimited = errors.New("rate limit exceeded")

// Node returns the running node named id, for the operator's views of
// package ops (ops.Status, ops.Members, ops.GossipAddr). ok is false when no
// config in force has a handler with that id.
func Node(id string) (n *weir.Node, ok bool) {
	nodes.mu.Lock()
	defer nodes.mu.Unlock()
	e, ok := nodes.m[id]
	if !ok {
		return nil, false
	}
	return e.node, true
}

// entry is one node and the handlers (of every config in force) using it.
type entry struct {
	id   string
	key  string // the settings the node was started with
	node *weir.Node
	refs int
}

// registry holds the nodes across config reloads, by id.
type registry struct {
	mu sync.Mutex
	m  map[string]*entry
}

var nodes = registry{m: map[string]*entry{}}

// acquire returns the node id with settings key: the running one when its
// settings are the same (putting rules in force when inline), else a new
// one from start, closing the one it replaces first so that addresses
// bound by it are free.
func (g *registry) acquire(id, key string, rules []quota.Rule, start func() (*weir.Node, error)) (*entry, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if e, ok := g.m[id]; ok {
		if e.key == key {
			if rules != nil {
				if err := e.node.SetRules(rules); err != nil {
					return nil, err
				}
			}
			e.refs++
			return e, nil
		}
		delete(g.m, id)
		e.node.Close()
	}
	n, err := start()
	if err != nil {
		return nil, err
	}
	e := &entry{id: id, key: key, node: n, refs: 1}
	g.m[id] = e
	return e, nil
}

// release drops one use of e, closing its node when it was the last.
func (g *registry) release(e *entry) {
	g.mu.Lock()
	defer g.mu.Unlock()
	e.refs--
	if e.refs > 0 {
		return
	}
	if g.m[e.id] == e {
		delete(g.m, e.id)
		e.node.Close()
	}
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)

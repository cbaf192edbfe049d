// Package weir is an embedded rate limiter for Go API gateways.
//
// A gateway creates a Node from a Config (rules inline or from a watched YAML
// file), then either wraps its handlers with Node.Middleware or asks
// Node.Allow / Node.Check directly. Every decision is local to the process: a
// map access and a short critical section, with no network call. The cluster
// and lease work (cluster/, lease/) build the distributed modes on top of the
// same decision path.
//
//	n, err := weir.New(weir.Config{RulesFile: "rules.yaml"})
//	if err != nil { ... }
//	defer n.Close()
//	http.ListenAndServe(addr, n.Middleware(upstream))
package weir

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/internal/clientip"
	"github.com/weir-dev/weir/internal/hitters"
	"github.com/weir-dev/weir/quota"
)

// DefaultMaxIdentityBytes is the longest identity a rule accepts when
// Config.MaxIdentityBytes is zero.
const DefaultMaxIdentityBytes = 1024

// ErrIdentityTooLong is reported (in Decision.Err, and as a 400 by the
// middleware) when a request's identity for some rule is longer than
// Config.MaxIdentityBytes. Such a request is not admitted and charges nothing.
var ErrIdentityTooLong = errors.New("weir: identity too long")

// ErrUnknownRule is returned by Check for a rule id that the rule set in force
// does not contain.
var ErrUnknownRule = errors.New("weir: unknown rule")

// ErrClosed is returned by calls on a Node after Close.
var ErrClosed = errors.New("weir: node closed")

// Config configures a Node. The zero Config is valid: a node with no rules,
// which admits everything. Every field is optional.
type Config struct {
	// RulesFile is a YAML rule file (see docs/rules.md). It is watched: a
	// valid change takes effect within about a second; an invalid one is
	// logged, counted and ignored, keeping the last good set in force. When it
	// cannot be read or is invalid at start, New returns an error naming
	// file, line and field, unless DefaultRules is set: then the node
	// enforces those and says so (log, the weir_rules_defaults_active
	// metric, Status). Rules put in force with SetRules stay until the
	// file's content next changes.
	RulesFile string

	// Rules are used when RulesFile is empty.
	Rules []quota.Rule

	// DefaultRules are the safe defaults enforced while RulesFile is
	// unreadable or invalid at start; setting them opts in to starting on
	// them (the node logs the file's error and reports UsingDefaultRules).
	// Empty means an unusable RulesFile at start is an error from New:
	// a node never starts with no rules because its file could not be read.
	DefaultRules []quota.Rule

	// ReloadPoll is how often the rule file is re-read as a fallback to file
	// system notifications. Zero means 5 seconds.
	ReloadPoll time.Duration

	// Clock is the time source. Nil means the system clock (wall time
	// advanced monotonically).
	Clock Clock

	// Registerer receives weir's Prometheus metrics. Nil registers nothing
	// (the metrics are still kept and served by AdminHandler's JSON).
	Registerer prometheus.Registerer

	// Logger receives reloads, rule errors and fail-open events. Nil means
	// the warnings and errors go to slog.Default() (as it is when New is
	// called) and the informational lines are dropped.
	Logger *slog.Logger

	// TrustedProxies are the CIDRs or addresses whose X-Forwarded-For and
	// Forwarded headers are believed when the middleware derives a client IP.
	// Empty means the client IP is always the connection's peer address.
	TrustedProxies []string

	// ForwardedHeader is the forwarding header the trusted proxies write:
	// "X-Forwarded-For" (the default when empty) or "Forwarded" (RFC 7239).
	// Only that one is read, so a client cannot slip in the other through a
	// proxy that passes it on untouched.
	ForwardedHeader string

	// UserFunc returns the authenticated user of a request for rules keyed
	// on "user". Nil means no request has a user.
	UserFunc func(*http.Request) string

	// TierFunc returns the caller's tier (for rules with tiers). Nil means no
	// tier.
	TierFunc func(*http.Request) string

	// MaxKeys caps the live keys of each algorithm's store. At the cap a new
	// key evicts an idle one (a full bucket, an ended window) first, else the
	// least indebted of the keys examined; what that one owed is forgiven
	// and counted (StoreStats, docs/overshoot.md: the local key cap). Zero
	// means 10 000 000.
	MaxKeys int

	// MaxIdentityBytes caps the length of an identity. Longer identities are
	// refused with ErrIdentityTooLong (400 from the middleware). Zero means
	// DefaultMaxIdentityBytes.
	MaxIdentityBytes int

	// HashSeed, when non-zero, makes identity hashing deterministic across
	// processes (for the simulator and reproducible tests). Zero draws a
	// random per-process seed, which defeats chosen-collision attacks.
	HashSeed uint64

	// TopK is the length of the top throttled identities lists. Zero means 20.
	TopK int

	// Name and Region name a node without a Cluster in its Overview (the
	// status page, `weir status`) and its identity reports; with a Cluster,
	// Cluster.Name and Cluster.Region name it and these are ignored. An
	// empty Name means "node"; an empty Region, none.
	Name, Region string

	// Cluster, when set, makes the node a member of its region's cluster:
	// shared and exact rules are then decided together with the other
	// nodes. Nil: every rule is enforced on this node alone.
	Cluster *ClusterConfig

	// Lease, when set, connects the node to the lease group (as a voter
	// or a client): with Lease.Rules the node takes its rules from there,
	// RulesAdminHandler serves the rules API, and durable rules are decided
	// there. Nil: a rule set with a durable rule is refused.
	Lease *LeaseConfig

	// Canary, when set, makes the node probe a canary rule a few times a
	// second and export whether it still sees rejections (weir_canary_ok;
	// see CanaryConfig). Nil: no canary.
	Canary *CanaryConfig
}

// Node is one weir limiter. It is safe for concurrent use by many goroutines.
type Node struct {
	cfg    Config
	now    func() int64
	log    *slog.Logger
	hasher bucket.Hasher
	// keyFormat is the bucket key format in force (keys.go): the latest
	// alone, else the lowest any member of the cluster speaks.
	keyFormat atomic.Uint32
	stores    *stores
	ip        *clientip.Resolver
	metrics   *metrics
	maxID     int

	throttled *hitters.Sketch
	shadowed  *hitters.Sketch

	holder  *quota.Holder
	watcher *quota.Watcher
	eng     engineHolder
	hist    histories    // every rule's generations (rulegen.go)
	cluster *clusterPart // nil without Config.Cluster
	lease   *leasePart   // nil without Config.Lease
	global  *globalPart  // nil unless global rules are leased (global_node.go)
	ops     opsPart      // events, recent per-identity counts, canary (ui.go)

	mu           sync.Mutex // guards closed and the rule-stats registry
	closed       bool
	ruleStats    map[string]*ruleStats
	usingDefault bool
	lastErr      error
}

// New validates cfg, loads the rules and returns a running Node. The error
// names the Config field that is wrong.
func New(cfg Config) (*Node, error) {
	if cfg.MaxKeys < 0 {
		return nil, fmt.Errorf("weir: Config.MaxKeys: must not be negative, got %d", cfg.MaxKeys)
	}
	if cfg.MaxIdentityBytes < 0 {
		return nil, fmt.Errorf("weir: Config.MaxIdentityBytes: must not be negative, got %d", cfg.MaxIdentityBytes)
	}
	if cfg.ReloadPoll < 0 {
		return nil, fmt.Errorf("weir: Config.ReloadPoll: must not be negative, got %v", cfg.ReloadPoll)
	}
	if cfg.TopK < 0 {
		return nil, fmt.Errorf("weir: Config.TopK: must not be negative, got %d", cfg.TopK)
	}
	if cfg.RulesFile != "" && len(cfg.Rules) > 0 {
		return nil, errors.New("weir: Config.Rules and Config.RulesFile are exclusive: set one")
	}
	ip, err := clientip.NewResolver(cfg.TrustedProxies)
	if err != nil {
		return nil, fmt.Errorf("weir: Config.TrustedProxies: %w", err)
	}
	fh := cfg.ForwardedHeader
	if fh == "" {
		fh = "X-Forwarded-For"
	}
	if ip, err = ip.Only(fh); err != nil {
		return nil, fmt.Errorf("weir: Config.ForwardedHeader: %w", err)
	}
	n := &Node{
		cfg:       cfg,
		now:       clockNanos(cfg.Clock),
		log:       cfg.Logger,
		ip:        ip,
		maxID:     cfg.MaxIdentityBytes,
		ruleStats: make(map[string]*ruleStats),
	}
	if n.log == nil {
		n.log = slog.New(warnAndAbove{slog.Default().Handler()})
	}
	if n.maxID == 0 {
		n.maxID = DefaultMaxIdentityBytes
	}
	n.keyFormat.Store(keyFormatLatest) // a cluster lowers it to what every member speaks
	if cfg.HashSeed != 0 {
		n.hasher = bucket.NewSeededHasher(cfg.HashSeed)
	} else {
		n.hasher = bucket.NewHasher()
	}
	maxKeys := cfg.MaxKeys
	if maxKeys == 0 {
		maxKeys = 10_000_000
	}
	if n.stores, err = newStores(maxKeys); err != nil {
		return nil, fmt.Errorf("weir: Config.MaxKeys: %w", err)
	}
	topK := cfg.TopK
	if topK == 0 {
		topK = 20
	}
	n.ops.recent = &recentCounts{started: n.now()}
	// The sketches' seeds come from the node's hasher: per process unless
	// Config.HashSeed, so that no one can choose colliding identities.
	n.throttled = hitters.New(hitters.Config{K: topK, Seed: n.hasher.Sum("\x00seed: throttled")})
	n.shadowed = hitters.New(hitters.Config{K: topK, Seed: n.hasher.Sum("\x00seed: shadowed")})
	n.metrics = newMetrics(n)
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(n.metrics); err != nil {
			return nil, fmt.Errorf("weir: Config.Registerer: %w", err)
		}
	}

	if cfg.Canary != nil {
		if n.ops.canary, err = newCanary(n, *cfg.Canary); err != nil {
			n.unregister()
			return nil, err
		}
	}
	if cfg.Lease != nil {
		if err := n.startLease(cfg.Lease); err != nil {
			n.unregister()
			return nil, err
		}
	}
	n.startGlobal()
	if cfg.Cluster != nil {
		if err := n.startCluster(cfg.Cluster); err != nil {
			n.stopLease()
			n.unregister()
			return nil, err
		}
		n.cluster.tr.SetInspector(n.inspectPeer)
	}
	if err := n.loadInitialRules(); err != nil {
		n.stopLease()
		n.stopCluster()
		n.unregister()
		return nil, err
	}
	n.runGlobal()
	if n.ops.canary != nil {
		go n.ops.canary.run()
	}
	return n, nil
}

func (n *Node) unregister() {
	if n.cfg.Registerer != nil {
		n.cfg.Registerer.Unregister(n.metrics)
	}
}

// loadInitialRules installs the first rule set and starts the file watcher.
func (n *Node) loadInitialRules() error {
	if n.cfg.Lease != nil && n.cfg.Lease.Rules {
		return n.loadLeaseRules()
	}
	if n.cfg.RulesFile == "" {
		set, err := quota.NewSet(n.cfg.Rules, 1)
		if err != nil {
			return fmt.Errorf("weir: Config.Rules: %w", err)
		}
		if err := n.checkDurable(setRules(set)); err != nil {
			return fmt.Errorf("weir: Config.Rules: %w", err)
		}
		n.holder = quota.NewHolder(set)
		n.install(set)
		return nil
	}
	if _, err := quota.NewSet(n.cfg.DefaultRules, 1); err != nil {
		return fmt.Errorf("weir: Config.DefaultRules: %w", err)
	}
	if err := n.checkDurable(slices.Values(n.cfg.DefaultRules)); err != nil {
		return fmt.Errorf("weir: Config.DefaultRules: %w", err)
	}
	var set *quota.Set
	var loadErr error
	if len(n.cfg.DefaultRules) == 0 {
		// Starting with no rules would admit everything: an unusable file
		// is refused unless the caller chose defaults to start on.
		rules, err := quota.LoadFile(n.cfg.RulesFile)
		if err == nil {
			set, err = quota.NewSet(rules, 1)
		}
		if err != nil {
			return fmt.Errorf("weir: Config.RulesFile %s unusable (set Config.DefaultRules to start on defaults instead): %w", n.cfg.RulesFile, err)
		}
	} else if set, loadErr = quota.LoadOrDefault(n.cfg.RulesFile, n.cfg.DefaultRules); set == nil {
		return fmt.Errorf("weir: Config.RulesFile: %w", loadErr)
	}
	if err := n.checkDurable(setRules(set)); err != nil {
		return fmt.Errorf("weir: Config.RulesFile %s: %w", n.cfg.RulesFile, err)
	}
	n.holder = quota.NewHolder(set)
	if loadErr != nil {
		n.mu.Lock()
		n.usingDefault = true
		n.lastErr = loadErr
		n.mu.Unlock()
		n.metrics.reloadErrors.Inc()
		n.log.Error("rule file unreadable at start: enforcing the default rules",
			"file", n.cfg.RulesFile, "err", loadErr, "default_rules", len(n.cfg.DefaultRules))
	}
	n.install(set)
	w, err := quota.WatchFile(context.Background(), n.cfg.RulesFile,
		quota.WatchOptions{Holder: n.holder, PollInterval: n.cfg.ReloadPoll}, n.onReload, n.onReloadError)
	if err != nil {
		return fmt.Errorf("weir: Config.RulesFile: watching: %w", err)
	}
	n.watcher = w
	return nil
}

func (n *Node) onReload(set *quota.Set) {
	if err := n.checkDurable(setRules(set)); err != nil {
		// Refused like an invalid file: the last good set stays in force.
		// (The watcher's holder has moved on to the refused set; the next
		// change of the file, back to the old content included, is a new
		// version that is checked again.)
		n.onReloadError(fmt.Errorf("quota: rules file %s rejected, keeping version %d: %w", n.cfg.RulesFile, n.rulesVersion(), err))
		return
	}
	n.mu.Lock()
	wasDefault := n.usingDefault
	n.usingDefault = false
	n.lastErr = nil
	n.mu.Unlock()
	n.install(set)
	n.log.Info("rules reloaded", "file", n.cfg.RulesFile, "version", set.Version(), "rules", set.Len(), "left_defaults", wasDefault)
}

func (n *Node) onReloadError(err error) {
	n.mu.Lock()
	n.lastErr = err
	n.mu.Unlock()
	n.metrics.reloadErrors.Inc()
	n.log.Error("rule reload failed: keeping the last good rule set", "file", n.cfg.RulesFile, "err", err,
		"version", n.holder.Current().Version())
}

// SetRules validates rules and, when valid, installs them as a new version.
// When invalid, the error names every problem and the rules in force stay.
// It is how an admin API or a control plane changes rules without a file.
func (n *Node) SetRules(rules []quota.Rule) error {
	if n.isClosed() {
		return ErrClosed
	}
	if err := n.checkDurable(slices.Values(rules)); err != nil {
		n.metrics.reloadErrors.Inc()
		return err
	}
	set, err := n.holder.Apply(rules)
	if err != nil {
		n.metrics.reloadErrors.Inc()
		return err
	}
	n.mu.Lock()
	n.usingDefault = false
	n.mu.Unlock()
	n.install(set)
	return nil
}

// Rules returns the rule set in force.
func (n *Node) Rules() *quota.Set { return n.eng.load().set }

// Status is a snapshot of a node's rule state.
type Status struct {
	// RulesVersion is the version of the rule set in force.
	RulesVersion uint64 `json:"rules_version"`
	// RulesDigest identifies the rule set's content.
	RulesDigest string `json:"rules_digest"`
	// UsingDefaultRules is true while the node enforces Config.DefaultRules
	// because its rule file could not be loaded at start.
	UsingDefaultRules bool `json:"using_default_rules"`
	// LastReloadError is the last failed reload, cleared by a good one.
	LastReloadError string `json:"last_reload_error,omitempty"`
	// KeyFormat is the bucket key format in force: 2 when identity
	// sources are namespaces (docs/security.md), 1 while some member of
	// the cluster speaks only format 1, in which every source of a chain
	// counts under its bare value (docs/operations.md, "Upgrading").
	KeyFormat uint32 `json:"key_format"`
}

// Status reports the rule state of the node.
func (n *Node) Status() Status {
	set := n.eng.load().set
	n.mu.Lock()
	defer n.mu.Unlock()
	st := Status{RulesVersion: set.Version(), RulesDigest: set.Digest(), UsingDefaultRules: n.usingDefault,
		KeyFormat: n.keyFormat.Load()}
	if n.lastErr != nil {
		st.LastReloadError = n.lastErr.Error()
	}
	return st
}

func (n *Node) isClosed() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.closed
}

// Close reports this node's unconfirmed spend to the owners, leaves the
// cluster gracefully, stops the rule watcher and unregisters the metrics.
// Decisions after Close still work on the last rule set, per node (a
// gateway draining its requests is not refused), but SetRules returns
// ErrClosed. Close is idempotent.
func (n *Node) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	n.mu.Unlock()
	if n.ops.canary != nil {
		n.ops.canary.close()
	}
	err := n.stopCluster()
	n.stopGlobal()
	if e := n.stopLease(); err == nil {
		err = e
	}
	if n.watcher != nil {
		if e := n.watcher.Close(); err == nil {
			err = e
		}
	}
	n.unregister()
	return err
}

// warnAndAbove passes on the records of Warn level and above: the default
// logger of a Node whose Config.Logger is nil, so that errors (an invalid
// rule file, a refused reload, a fail-open) are seen and routine lines are
// not.
type warnAndAbove struct{ slog.Handler }

func (h warnAndAbove) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && h.Handler.Enabled(ctx, l)
}

func (h warnAndAbove) WithAttrs(as []slog.Attr) slog.Handler {
	return warnAndAbove{h.Handler.WithAttrs(as)}
}

func (h warnAndAbove) WithGroup(name string) slog.Handler {
	return warnAndAbove{h.Handler.WithGroup(name)}
}

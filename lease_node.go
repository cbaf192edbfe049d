package weir

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"iter"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/lease"
	"github.com/weir-dev/weir/lease/raftgroup"
	"github.com/weir-dev/weir/quota"
)

// LeaseConfig connects a Node to the lease group: the small Raft group that
// keeps the rules (versioned and audited), decides durable rules (one Raft
// commit per decision; docs/durable.md) and leases global limits to
// regions (docs/global.md). A node is either one of the group's voters (Voter) or a client of
// them (Voters); see raftgroup.Group and docs/rules-api.md.
type LeaseConfig struct {
	// Voter makes this node a voter: the group's configuration (data
	// directory, Raft and RPC addresses, the initial voters).
	Voter *raftgroup.Config
	// Voters are the lease RPC addresses of the voters, for a node that is
	// not one. Exactly one of Voter and Voters is set.
	Voters []string
	// ClientTLS secures a client's calls to the voters.
	ClientTLS *tls.Config
	// Rules makes the group this node's only source of rules: Config.Rules
	// and Config.RulesFile must then be empty. Until the first rule set
	// arrives the node enforces Config.DefaultRules (and says so in Status
	// and the weir_rules_defaults_active metric).
	Rules bool
	// CheckInterval is how often the node asks the group for its rule
	// version, catching a change that gossip missed; 0 means 5s. A rule
	// change usually arrives sooner: a voter sees it as it applies, and
	// every node fetches as soon as gossip shows a peer running a newer
	// version.
	CheckInterval time.Duration
	// AdminTokens maps each bearer token of RulesAdminHandler to the
	// principal it authenticates (recorded in the audit history).
	AdminTokens map[string]string
	// DurableTimeout bounds how long a request waits for the lease group's
	// decision of a durable rule (one Raft commit, forwarded to the leader)
	// before the rule's on_failure decides it, degraded and counted (a
	// request's ctx bounds it too); 0 means DefaultDurableTimeout. See
	// docs/durable.md.
	DurableTimeout time.Duration
	// Machine is, on a node that is not a voter, the lease machine's
	// configuration the voters use (Regions, LeaseDuration, MaxSkew): a
	// node in a cluster leases its `scope: global` rules only when its
	// region is among Regions (docs/global.md). A voter uses
	// Voter.Machine and ignores this.
	Machine lease.Config
	// RefreshInterval is how often a node reports the demand of the global
	// identities it owns and renews their leases; 0 means a fifth of the
	// lease lifetime. Keep it well below the lifetime.
	RefreshInterval time.Duration
}

// DefaultDurableTimeout is LeaseConfig.DurableTimeout's default: far above
// a healthy Raft commit (milliseconds), far below an election.
const DefaultDurableTimeout = 250 * time.Millisecond

// leasePart is a node's connection to the lease group.
type leasePart struct {
	group  *raftgroup.Group  // when a voter
	client *raftgroup.Client // otherwise
	svc    raftgroup.RuleService
	admin  *raftgroup.Admin
	kick   chan struct{}
	done   chan struct{}
	ctx    context.Context // cancelled when the node stops: bounds every call to the group
	stop   context.CancelFunc
	wg     sync.WaitGroup
	seen   atomic.Uint64 // the newest rule version heard of (group or gossip)
	every  time.Duration

	durable        raftgroup.KeyedDurableService // the group or the client
	durableTimeout time.Duration
	lastLog        atomic.Int64 // unix ns of the last durable fail-open log line
}

// startLease connects the node to the lease group (before its rules are
// loaded: with LeaseConfig.Rules the group is where they come from).
func (n *Node) startLease(lc *LeaseConfig) error {
	if (lc.Voter == nil) == (len(lc.Voters) == 0) {
		return errors.New("weir: Config.Lease: set exactly one of Voter (this node is a voter) and Voters (the voters' addresses)")
	}
	if lc.Rules && (n.cfg.RulesFile != "" || len(n.cfg.Rules) > 0) {
		return errors.New("weir: Config.Lease.Rules: the lease group is then the only source of rules; leave Config.Rules and Config.RulesFile empty")
	}
	if lc.CheckInterval < 0 {
		return fmt.Errorf("weir: Config.Lease.CheckInterval: must not be negative, got %v", lc.CheckInterval)
	}
	if lc.DurableTimeout < 0 {
		return fmt.Errorf("weir: Config.Lease.DurableTimeout: must not be negative, got %v", lc.DurableTimeout)
	}
	lp := &leasePart{kick: make(chan struct{}, 1), done: make(chan struct{}), every: lc.CheckInterval,
		durableTimeout: lc.DurableTimeout}
	lp.ctx, lp.stop = context.WithCancel(context.Background())
	if lp.every == 0 {
		lp.every = 5 * time.Second
	}
	if lp.durableTimeout == 0 {
		lp.durableTimeout = DefaultDurableTimeout
	}
	if lc.Voter != nil {
		g, err := raftgroup.Start(*lc.Voter)
		if err != nil {
			return fmt.Errorf("weir: Config.Lease.Voter: %w", err)
		}
		lp.group, lp.svc, lp.durable = g, g, g
	} else {
		ccfg := raftgroup.ClientConfig{Voters: lc.Voters, TLS: lc.ClientTLS}
		if cc := n.cfg.Cluster; cc != nil && cc.net != nil {
			// A test's fault-injecting network (ClusterConfig.net).
			ccfg.DialOptions = []grpc.DialOption{grpc.WithContextDialer(cc.net.dial)}
		}
		c, err := raftgroup.NewClient(ccfg)
		if err != nil {
			return fmt.Errorf("weir: Config.Lease.Voters: %w", err)
		}
		lp.client, lp.svc, lp.durable = c, c, c
	}
	if len(lc.AdminTokens) > 0 {
		a, err := raftgroup.AdminHandler(raftgroup.AdminConfig{Store: lp.svc, Tokens: lc.AdminTokens, Logger: n.log})
		if err != nil {
			lp.close()
			return fmt.Errorf("weir: Config.Lease.AdminTokens: %w", err)
		}
		lp.admin = a
	}
	n.lease = lp
	return nil
}

// loadLeaseRules installs DefaultRules, tries once to fetch the group's
// rules, and starts the loop that follows the group's versions.
func (n *Node) loadLeaseRules() error {
	set, err := quota.NewSet(n.cfg.DefaultRules, 0)
	if err != nil {
		return fmt.Errorf("weir: Config.DefaultRules: %w", err)
	}
	n.holder = quota.NewHolder(set)
	n.mu.Lock()
	n.usingDefault = true
	n.mu.Unlock()
	n.install(set)
	lp := n.lease
	n.fetchRules(lp.every)
	lp.wg.Add(1)
	go n.followRules()
	return nil
}

// followRules fetches the group's rule set when a newer version is heard of
// (a voter's own replica, gossip) or every CheckInterval.
func (n *Node) followRules() {
	lp := n.lease
	defer lp.wg.Done()
	check := time.NewTicker(lp.every)
	defer check.Stop()
	// A voter reads its own replica, which costs nothing: often.
	local := time.NewTicker(100 * time.Millisecond)
	defer local.Stop()
	for {
		select {
		case <-lp.done:
			return
		case <-lp.kick:
			n.fetchRules(lp.every)
		case <-check.C:
			n.fetchRules(lp.every)
		case <-local.C:
			if lp.group != nil {
				if v, _ := lp.group.Rules(); v > n.rulesVersion() {
					n.fetchRules(lp.every)
				}
			}
		}
	}
}

// fetchRules reads the group's rules and installs them if newer.
func (n *Node) fetchRules(timeout time.Duration) {
	lp := n.lease
	ctx, cancel := context.WithTimeout(lp.ctx, timeout)
	defer cancel()
	v, rules, err := lp.svc.ReadRules(ctx, false)
	if err != nil {
		n.log.Warn("lease group: could not read the rules; keeping the set in force", "err", err)
		return
	}
	n.noteRulesVersion(v)
	if v != 0 && v < n.rulesVersion() {
		n.rulesWentBack(ctx)
		return
	}
	if v == 0 || v <= n.rulesVersion() {
		return
	}
	set, err := n.holder.ApplyVersion(rules, v)
	if err != nil {
		n.metrics.reloadErrors.Inc()
		n.log.Error("lease group: its rule set does not validate here; keeping the set in force", "version", v, "err", err)
		return
	}
	n.mu.Lock()
	n.usingDefault = false
	n.lastErr = nil
	n.mu.Unlock()
	n.install(set)
	n.log.Info("rules from the lease group", "version", set.Version(), "rules", set.Len())
}

// rulesWentBack handles a read of the group's rules older than the set in
// force. A replica behind its leader answers such a read, which changes
// nothing; but when the leader's set is older too, the group lost
// acknowledged changes (a voter restarted from a stale copy of its data
// directory, docs/reliability.md), and its next changes reuse the lost
// versions: a node that kept its newer set would ignore them. The node
// then installs the group's set, and says so loudly.
func (n *Node) rulesWentBack(ctx context.Context) {
	v, rules, err := n.lease.svc.ReadRules(ctx, true)
	if err != nil {
		n.log.Warn("lease group: could not read the rules from its leader; keeping the set in force", "err", err)
		return
	}
	cur := n.rulesVersion()
	if v == 0 || v >= cur {
		return // the replica read was behind its leader
	}
	set, err := n.holder.Replace(rules, v)
	if err != nil {
		n.metrics.reloadErrors.Inc()
		n.log.Error("lease group: its rule set does not validate here; keeping the set in force", "version", v, "err", err)
		return
	}
	n.metrics.rulesWentBack.Inc()
	n.log.Error("lease group: its rules went back to an older version; installing the group's set (acknowledged rule changes were lost in the group)",
		"from", cur, "to", v)
	n.install(set)
}

// noteRulesVersion records a rule version heard of; a newer one than in
// force wakes the loop that fetches it.
func (n *Node) noteRulesVersion(v uint64) {
	lp := n.lease
	if lp == nil {
		return
	}
	for {
		old := lp.seen.Load()
		if v <= old || lp.seen.CompareAndSwap(old, v) {
			break
		}
	}
	if n.cfg.Lease.Rules && v > n.rulesVersion() {
		select {
		case lp.kick <- struct{}{}:
		default:
		}
	}
}

// rulesBehind is how many versions the node's rules trail the newest one it
// heard of (from the group or a peer's gossip).
func (n *Node) rulesBehind() uint64 {
	lp := n.lease
	if lp == nil {
		return 0
	}
	if s, cur := lp.seen.Load(), n.rulesVersion(); s > cur {
		return s - cur
	}
	return 0
}

// rulesAdminHandler serves the rules API of docs/rules-api.md (PUT, GET,
// DELETE /v1/rules/{id}, GET /v1/rules, GET /v1/rules/history) against the
// lease group, authenticated by Config.Lease.AdminTokens or a verified
// client certificate. Serve it over TLS. It answers 503 on a node with no
// lease group or no tokens configured.
func (n *Node) rulesAdminHandler() http.Handler {
	if n.lease == nil || n.lease.admin == nil {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "weir: no lease group or no admin tokens configured on this node", http.StatusServiceUnavailable)
		})
	}
	return n.lease.admin
}

// leaseGroup returns the lease group this node is a voter of, or nil.
func (n *Node) leaseGroup() *raftgroup.Group {
	if n.lease == nil {
		return nil
	}
	return n.lease.group
}

// stopLease stops following the group and closes the connection to it.
func (n *Node) stopLease() error {
	lp := n.lease
	if lp == nil {
		return nil
	}
	close(lp.done)
	lp.stop() // cancels a fetch in flight
	lp.wg.Wait()
	return lp.close()
}

func (lp *leasePart) close() error {
	lp.stop()
	if lp.group != nil {
		return lp.group.Close()
	}
	if lp.client != nil {
		return lp.client.Close()
	}
	return nil
}

// rulesVersion is the version of the rules in force, 0 before any (gossip
// may report peers while New is still loading the rules).
func (n *Node) rulesVersion() uint64 {
	if e := n.eng.load(); e != nil {
		return e.set.Version()
	}
	return 0
}

// ErrDurableNeedsLease is wrapped by the error that refuses a rule set
// holding a durable rule on a node without Config.Lease (New, SetRules, a
// rule file's reload): a durable rule's counters live in the lease group.
var ErrDurableNeedsLease = errors.New("weir: a durable rule needs Config.Lease")

// checkDurable refuses rules holding a durable rule when the node has no
// lease group, naming the first such rule.
func (n *Node) checkDurable(rules iter.Seq[quota.Rule]) error {
	if n.cfg.Lease != nil {
		return nil
	}
	for r := range rules {
		if r.Durable {
			return fmt.Errorf("%w: rule %q is durable (its counters live in the lease group, decided through Raft), but the node has no lease group: set Config.Lease or drop durable", ErrDurableNeedsLease, r.ID)
		}
	}
	return nil
}

// setRules iterates a set's rules for checkDurable.
func setRules(s *quota.Set) iter.Seq[quota.Rule] {
	return func(yield func(quota.Rule) bool) {
		for i := range s.Len() {
			if !yield(*s.Rule(i)) {
				return
			}
		}
	}
}

// decideDurable decides a durable rule's request through the lease group,
// bounded by Config.Lease.DurableTimeout and ctx. When the group cannot
// answer in time (no leader, no quorum, unreachable, or the caller gave
// up), the rule's on_failure decides, degraded: open admits; closed
// rejects; and local rejects too, for on a durable rule a node-local
// bucket would start full on every node and hand out exactly the free
// window that durable exists to prevent (docs/durable.md). Such a
// rejection says retry in a second. A failed call may still have been
// applied by the group: rejecting then never admits too much.
func (n *Node) decideDurable(ctx context.Context, p *pending) (bucket.Decision, bool) {
	if p.cost > p.spec.burst {
		// It can never pass (GCRA's edge case): no commit needed.
		return bucket.Decision{Limit: p.spec.burst, RetryAfter: bucket.Never}, false
	}
	lp := n.lease
	ctx, cancel := context.WithTimeout(ctx, lp.durableTimeout)
	defer cancel()
	rule := lease.DurableRule{ID: p.c.r.ID, Limit: p.spec.limit, Window: p.spec.window, Burst: p.spec.burst}
	bd, err := lp.durable.DurableKeyed(ctx, rule, durableKey(p), p.cost)
	if err == nil {
		return bd, false
	}
	if p.c.r.OnFailure == quota.OnFailureOpen {
		return bucket.Decision{Allowed: true, Limit: p.spec.burst, Remaining: p.spec.burst}, true
	}
	return bucket.Decision{Limit: p.spec.burst, RetryAfter: time.Second}, true
}

// noteDurableDegraded counts and logs (at most once a second) a durable
// decision made by on_failure because the lease group did not answer: the
// same counter as the cluster's fail-open (weir_fail_open_total).
func (n *Node) noteDurableDegraded(c *crule, p *pending, now int64) {
	c.stats.degraded.add(p.key)
	lp := n.lease
	if last := lp.lastLog.Load(); now-last >= int64(time.Second) && lp.lastLog.CompareAndSwap(last, now) {
		n.log.Warn("lease group did not answer a durable decision: decided by on_failure", "rule", c.r.ID,
			"on_failure", c.r.OnFailure, "timeout", lp.durableTimeout)
	}
}

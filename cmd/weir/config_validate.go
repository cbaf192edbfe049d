package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/weir-dev/weir/quota"
)

// validate checks every field (after applyDefaults) and reports every
// problem, each naming its field.
func (c *Config) validate() error {
	ck := &configCheck{c: c}
	ck.node()
	ck.cluster()
	ck.ruleSources()
	ck.lease()
	ck.operators()
	ck.logAndShutdown()
	return errors.Join(ck.errs...)
}

// configCheck collects the problems validate finds, in the order it finds
// them, so that one run reports all of them rather than the first.
type configCheck struct {
	c    *Config
	errs []error
}

// bad records a problem with field (a YAML path such as "lease.voter.rpc",
// or the flag that set it; see Config.errf).
func (ck *configCheck) bad(field, format string, args ...any) {
	ck.errs = append(ck.errs, ck.c.errf(field, format, args...))
}

// addr checks a required listen or dial address: host:port with a port in
// [0, 65535]. The host is not resolved, so validation needs no network.
func (ck *configCheck) addr(field, v string) {
	if v == "" {
		ck.bad(field, "required")
		return
	}
	if _, port, err := net.SplitHostPort(v); err != nil {
		ck.bad(field, "want host:port, got %q", v)
	} else if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		ck.bad(field, "bad port in %q", v)
	}
}

// nonNeg checks a duration whose zero value means its default.
func (ck *configCheck) nonNeg(field string, d time.Duration) {
	if d < 0 {
		ck.bad(field, "must not be negative, got %v", d)
	}
}

// file checks that a required path names a regular file, so that a missing
// certificate is reported at start with its field, not at the first
// handshake.
func (ck *configCheck) file(field, path string) {
	if path == "" {
		ck.bad(field, "required")
		return
	}
	if err := regularFile(path); err != nil {
		ck.bad(field, "%v", err)
	}
}

// tlsFiles checks an optional TLS section: its cert and key, and its CA when
// needCA (the listener verifies its clients, as peers and voters do) or when
// one is set.
func (ck *configCheck) tlsFiles(field string, t *TLSFiles, needCA bool) {
	if t == nil {
		return
	}
	ck.file(field+".cert", t.Cert)
	ck.file(field+".key", t.Key)
	if needCA || t.CA != "" {
		ck.file(field+".ca", t.CA)
	}
}

// node checks that the node's name and region, the identifiers the cluster
// and the lease group know the node by, hold no spaces or slashes.
func (ck *configCheck) node() {
	c := ck.c
	if strings.ContainsAny(c.Node.Name, " \t\n/") {
		ck.bad("node.name", "must not contain spaces or slashes, got %q", c.Node.Name)
	}
	if strings.ContainsAny(c.Node.Region, " \t\n/") {
		ck.bad("node.region", "must not contain spaces or slashes, got %q", c.Node.Region)
	}
}

// cluster checks the gossip and peer sections. The peer addresses and TLS
// matter only in a cluster, so without gossip a peer TLS section is refused
// as a sign of a config missing its cluster; the peer timeouts are checked
// either way.
func (ck *configCheck) cluster() {
	c := ck.c
	if g := c.Gossip; g != nil {
		ck.addr("gossip.bind", g.Bind)
		if g.Advertise != "" {
			ck.addr("gossip.advertise", g.Advertise)
		}
		for i, j := range g.Join {
			ck.addr(fmt.Sprintf("gossip.join[%d]", i), j)
		}
		for i, k := range g.Keys {
			if _, err := k.load(); err != nil {
				ck.bad(fmt.Sprintf("gossip.keys[%d]", i), "%v", err)
			}
		}
		ck.addr("peer.rpc", c.Peer.RPC)
		ck.tlsFiles("peer.tls", c.Peer.TLS, true)
	} else if c.Peer.TLS != nil {
		ck.bad("peer.tls", "peer TLS without a cluster: add a gossip section (or --gossip/--join)")
	}
	ck.nonNeg("peer.sync_interval", c.Peer.SyncInterval)
	ck.nonNeg("peer.decide_timeout", c.Peer.DecideTimeout)
	ck.nonNeg("peer.call_timeout", c.Peer.CallTimeout)
	ck.nonNeg("peer.handoff_timeout", c.Peer.HandoffTimeout)
}

// ruleSources checks where the rules come from: exactly one of rules.file
// (which must load), rules.lease (which needs a lease section) and the Envoy
// descriptors, since a daemon needs something to enforce and two sources
// would fight over the one rule set.
func (ck *configCheck) ruleSources() {
	c := ck.c
	sources := 0
	if c.Rules.File != "" {
		sources++
		if err := regularFile(c.Rules.File); err != nil {
			ck.bad("rules.file", "%v", err)
		} else if _, err := quota.LoadFile(c.Rules.File); err != nil {
			ck.bad("rules.file", "%v", err)
		}
	}
	if c.Rules.Lease {
		sources++
		if c.Lease == nil {
			ck.bad("rules.lease", "needs a lease section (the group the rules come from)")
		}
	}
	if e := c.Envoy; e != nil {
		if c.servesEnvoy() {
			sources++
		} else {
			ck.bad("envoy.descriptors", "required: at least one descriptor file, or envoy.directory")
		}
		ck.addr("envoy.listen", e.Listen)
		if _, err := c.envoyConfig(); err != nil {
			ck.errs = append(ck.errs, err)
		}
	}
	switch {
	case sources == 0:
		ck.bad("rules", "no rules: set rules.file (or --rules), rules.lease, or envoy.descriptors (or envoy.directory)")
	case sources > 1:
		ck.bad("rules", "rules.file, rules.lease and envoy.descriptors are exclusive: set one")
	}
}

// lease checks the lease section, if any: the node is either a voter or a
// client of the voters' addresses, its TLS and timings are sane, and the
// regions leased to include the node's own, or its global limits would get
// no share.
func (ck *configCheck) lease() {
	c := ck.c
	l := c.Lease
	if l == nil {
		return
	}
	if (l.Voter == nil) == (len(l.Voters) == 0) {
		ck.bad("lease", "set exactly one of voter (this node is a voter) and voters (the voters' lease RPC addresses)")
	}
	for i, v := range l.Voters {
		ck.addr(fmt.Sprintf("lease.voters[%d]", i), v)
	}
	if v := l.Voter; v != nil {
		ck.voter(v)
	}
	ck.tlsFiles("lease.tls", l.TLS, true)
	ck.nonNeg("lease.lease_duration", l.LeaseDuration)
	ck.nonNeg("lease.max_skew", l.MaxSkew)
	ck.nonNeg("lease.check_interval", l.CheckInterval)
	if !slices.Contains(l.Regions, c.Node.Region) {
		ck.bad("lease.regions", "must include this node's region %q", c.Node.Region)
	}
}

// voter checks lease.voter: its data directory and addresses, and the
// initial configuration it bootstraps, which must name each voter once,
// include this node, and hold 1, 3 or 5 voters (an even group tolerates no
// more failures than the odd one below it).
func (ck *configCheck) voter(v *VoterSection) {
	c := ck.c
	if v.DataDir == "" {
		ck.bad("lease.voter.data_dir", "required")
	}
	ck.addr("lease.voter.raft", v.Raft)
	ck.addr("lease.voter.rpc", v.RPC)
	self := false
	names := map[string]bool{}
	for i, va := range v.Voters {
		f := fmt.Sprintf("lease.voter.voters[%d]", i)
		if va.Name == "" {
			ck.bad(f+".name", "required")
		}
		if names[va.Name] {
			ck.bad(f+".name", "voter %q listed twice", va.Name)
		}
		names[va.Name] = true
		self = self || va.Name == c.Node.Name
		ck.addr(f+".raft", va.Raft)
		ck.addr(f+".rpc", va.RPC)
	}
	if len(v.Voters) > 0 && !self {
		ck.bad("lease.voter.voters", "must list this node (%q) among the voters", c.Node.Name)
	}
	if n := len(v.Voters); n != 0 && n != 1 && n != 3 && n != 5 {
		ck.bad("lease.voter.voters", "want 1, 3 or 5 voters, got %d", n)
	}
}

// operators checks what operators reach: the HTTP listener and its TLS, the
// admin tokens (read now, so a bad token file fails the start rather than
// the first rules API call), max_keys and the enforcement canary.
func (ck *configCheck) operators() {
	c := ck.c
	ck.addr("http.listen", c.HTTP.Listen)
	ck.tlsFiles("http.tls", c.HTTP.TLS, false)
	if c.AdminTokens.File != "" {
		ck.file("admin_tokens.file", c.AdminTokens.File)
	}
	if _, err := c.tokens(os.Getenv); err != nil {
		ck.errs = append(ck.errs, err)
	}
	if c.MaxKeys < 0 {
		ck.bad("max_keys", "must not be negative, got %d", c.MaxKeys)
	}
	if k := c.Canary; k != nil {
		if k.Rule == "" {
			ck.bad("canary.rule", "required")
		}
		ck.nonNeg("canary.interval", k.Interval)
		ck.nonNeg("canary.window", k.Window)
	}
}

// logAndShutdown checks the log level and format against the values the
// daemon knows, and that the shutdown drain leaves calls in flight some
// time to finish.
func (ck *configCheck) logAndShutdown() {
	c := ck.c
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		ck.bad("log.level", "want debug, info, warn or error, got %q", c.Log.Level)
	}
	switch c.Log.Format {
	case "text", "json":
	default:
		ck.bad("log.format", "want text or json, got %q", c.Log.Format)
	}
	if c.Shutdown.Drain <= 0 {
		ck.bad("shutdown.drain", "must be positive, got %v", c.Shutdown.Drain)
	}
}

package main

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/envoyconf"
	"github.com/weir-dev/weir/lease"
	"github.com/weir-dev/weir/lease/raftgroup"
	"github.com/weir-dev/weir/ops"
	"github.com/weir-dev/weir/rls"
)

// Addrs are the addresses a running daemon bound (ports picked when the
// config said 0). It is what `weir serve` prints as its ready line.
type Addrs struct {
	Name      string `json:"name"`
	Region    string `json:"region"`
	HTTP      string `json:"http"`
	HTTPS     bool   `json:"https,omitempty"`
	RLS       string `json:"rls,omitempty"`
	Gossip    string `json:"gossip,omitempty"`
	LeaseRaft string `json:"lease_raft,omitempty"`
	LeaseRPC  string `json:"lease_rpc,omitempty"`
}

// daemon is one running weir node with its listeners.
type daemon struct {
	cfg      *Config
	log      *slog.Logger
	node     *weir.Node
	httpSrv  *http.Server
	rlsSrv   *grpc.Server
	served   chan error // the HTTP and RLS servers' Serve results
	servers  int
	addrs    Addrs
	draining atomic.Bool

	// The Envoy service and the descriptors it serves: reload replaces
	// both. reloads counts reloads by result.
	rls      *rls.Service
	reloadMu sync.Mutex
	envoy    *envoyconf.Config
	reloads  *prometheus.CounterVec
	// inForce is the digest of the descriptor files served; refused that
	// of the last files refused (each content is reported and counted
	// once, whichever of SIGHUP, a change or the poll reads it).
	inForce, refused [sha256.Size]byte
	watch            *dirWatcher

	stopOnce sync.Once
	stopErr  error
}

// newLogger builds the daemon's log on w from the config's log section.
func newLogger(c LogSection, w io.Writer) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(c.Level))
	opts := &slog.HandlerOptions{Level: lvl}
	if c.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// startDaemon binds every listener, starts the node (which joins its
// cluster and lease group) and serves RLS and HTTP. On error nothing is
// left running.
func startDaemon(cfg *Config, log *slog.Logger) (_ *daemon, err error) {
	d := &daemon{cfg: cfg, log: log, served: make(chan error, 2), addrs: Addrs{Name: cfg.Node.Name, Region: cfg.Node.Region}}
	st := &startup{cfg: cfg}
	defer func() {
		if err != nil {
			st.closeAll()
		}
	}()
	httpLn, err := st.listen("http.listen", cfg.HTTP.Listen)
	if err != nil {
		return nil, err
	}
	d.addrs.HTTP = httpLn.Addr().String()
	var rlsLn net.Listener
	if cfg.Envoy != nil {
		if rlsLn, err = st.listen("envoy.listen", cfg.Envoy.Listen); err != nil {
			return nil, err
		}
		d.addrs.RLS = rlsLn.Addr().String()
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	wc := weir.Config{Registerer: reg, Logger: log, TrustedProxies: cfg.TrustedProxies, MaxKeys: cfg.MaxKeys,
		RulesFile: cfg.Rules.File, Name: cfg.Node.Name, Region: cfg.Node.Region}
	var envoyCfg *envoyconf.Config
	if cfg.servesEnvoy() {
		if envoyCfg, err = d.loadEnvoy(); err != nil {
			return nil, err
		}
		wc.Rules = envoyCfg.Rules()
	}
	if cfg.Gossip != nil {
		if wc.Cluster, err = cfg.clusterConfig(); err != nil {
			return nil, err
		}
	}
	tokens, err := cfg.tokens(os.Getenv)
	if err != nil {
		return nil, err
	}
	if cfg.Lease != nil {
		if wc.Lease, err = d.leaseConfig(st, tokens); err != nil {
			return nil, err
		}
	} else if len(tokens) > 0 {
		log.Warn("admin tokens are configured but there is no lease section: the rules API answers 503")
	}
	if k := cfg.Canary; k != nil {
		wc.Canary = &weir.CanaryConfig{Rule: k.Rule, Identity: k.Identity, Interval: k.Interval, Window: k.Window}
	}
	node, err := weir.New(wc)
	if err != nil {
		return nil, err
	}
	st.onFail(func() { node.Close() })
	d.node = node
	d.addrs.Gossip = ops.GossipAddr(node)

	d.envoy = envoyCfg
	d.countReloads(reg)
	if rlsLn != nil {
		if err = d.serveRLS(st, reg, rlsLn); err != nil {
			return nil, err
		}
	}
	if err = d.serveHTTP(reg, httpLn); err != nil {
		return nil, err
	}
	return d, nil
}

// startup is what startDaemon has opened so far: listeners, the node, the
// directory watch. When the start fails part way, closeAll closes them
// newest first, so that a failed start leaves nothing bound or running.
type startup struct {
	cfg     *Config
	closers []func()
}

// listen binds a TCP listener for the config field that names its address;
// the error names that field.
func (st *startup) listen(field, addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, st.cfg.errf(field, "%v", err)
	}
	st.onFail(func() { ln.Close() })
	return ln, nil
}

// onFail adds close to what closeAll closes.
func (st *startup) onFail(close func()) { st.closers = append(st.closers, close) }

// closeAll closes everything opened, newest first.
func (st *startup) closeAll() {
	for i := len(st.closers) - 1; i >= 0; i-- {
		st.closers[i]()
	}
}

// loadEnvoy reads and compiles the Envoy descriptor files served at start,
// and records their digest as the content in force, so that a reload of the
// same files is no change.
func (d *daemon) loadEnvoy() (*envoyconf.Config, error) {
	files, err := d.cfg.readEnvoyFiles()
	if err != nil {
		return nil, err
	}
	envoyCfg, err := d.cfg.compileEnvoy(files)
	if err != nil {
		return nil, err
	}
	d.inForce = files.digest
	d.warnSkipped(files)
	return envoyCfg, nil
}

// clusterConfig builds the node's cluster config from the gossip and peer
// sections (c.Gossip is set): the gossip keyring, whose first key encrypts
// and all of which decrypt so that keys can be rotated, and the peers'
// mutual TLS.
func (c *Config) clusterConfig() (*weir.ClusterConfig, error) {
	g := c.Gossip
	cc := &weir.ClusterConfig{Name: c.Node.Name, Region: c.Node.Region, GossipAddr: g.Bind, AdvertiseAddr: g.Advertise,
		Join: g.Join, RPCAddr: c.Peer.RPC, SyncInterval: c.Peer.SyncInterval, DecideTimeout: c.Peer.DecideTimeout,
		CallTimeout: c.Peer.CallTimeout, HandoffTimeout: c.Peer.HandoffTimeout, LocalTiming: g.LocalTiming, Label: g.Label}
	var err error
	if len(g.Keys) > 0 {
		keys := make([][]byte, 0, len(g.Keys))
		for _, k := range g.Keys {
			b, err := k.load()
			if err != nil {
				return nil, c.errf("gossip.keys", "%v", err)
			}
			keys = append(keys, b)
		}
		if cc.Keyring, err = memberlist.NewKeyring(keys[1:], keys[0]); err != nil {
			return nil, c.errf("gossip.keys", "%v", err)
		}
	}
	if t := c.Peer.TLS; t != nil {
		if cc.ServerTLS, err = serverTLS(t, true); err != nil {
			return nil, c.errf("peer.tls", "%v", err)
		}
		if cc.ClientTLS, err = clientTLS(t); err != nil {
			return nil, c.errf("peer.tls", "%v", err)
		}
	}
	return cc, nil
}

// leaseConfig builds the node's lease config from the lease section
// (d.cfg.Lease is set): as a voter, which binds the Raft and lease RPC
// listeners here so that their addresses are known before the node starts,
// or as a client of the voters' addresses.
func (d *daemon) leaseConfig(st *startup, tokens map[string]string) (*weir.LeaseConfig, error) {
	cfg := d.cfg
	l := cfg.Lease
	lc := &weir.LeaseConfig{Rules: cfg.Rules.Lease, CheckInterval: l.CheckInterval, AdminTokens: tokens,
		Machine: lease.Config{Regions: l.Regions, LeaseDuration: l.LeaseDuration, MaxSkew: l.MaxSkew}}
	var err error
	if l.TLS != nil {
		if lc.ClientTLS, err = clientTLS(l.TLS); err != nil {
			return nil, cfg.errf("lease.tls", "%v", err)
		}
	}
	if v := l.Voter; v != nil {
		if lc.Voter, err = d.voterGroup(st, v, lc); err != nil {
			return nil, err
		}
	} else {
		lc.Voters = l.Voters
	}
	return lc, nil
}

// voterGroup binds the voter's Raft and lease RPC listeners and builds its
// lease group config: the initial voters (this node alone when none are
// listed), each voter's lease RPC address, and the voters' mutual TLS,
// whose client side is lc's.
func (d *daemon) voterGroup(st *startup, v *VoterSection, lc *weir.LeaseConfig) (*raftgroup.Config, error) {
	cfg := d.cfg
	raftLn, err := st.listen("lease.voter.raft", v.Raft)
	if err != nil {
		return nil, err
	}
	rpcLn, err := st.listen("lease.voter.rpc", v.RPC)
	if err != nil {
		return nil, err
	}
	d.addrs.LeaseRaft, d.addrs.LeaseRPC = raftLn.Addr().String(), rpcLn.Addr().String()
	gc := &raftgroup.Config{Name: cfg.Node.Name, Dir: v.DataDir, RaftListener: raftLn, RPCListener: rpcLn,
		Machine: lc.Machine, RPCPeers: map[string]string{}, Logger: d.log}
	if len(v.Voters) == 0 {
		gc.Voters = []raftgroup.Voter{{Name: cfg.Node.Name}}
		gc.RPCPeers[cfg.Node.Name] = d.addrs.LeaseRPC
	}
	for _, va := range v.Voters {
		gc.Voters = append(gc.Voters, raftgroup.Voter{Name: va.Name, Addr: va.Raft})
		gc.RPCPeers[va.Name] = va.RPC
	}
	if t := cfg.Lease.TLS; t != nil {
		if gc.ServerTLS, err = serverTLS(t, true); err != nil {
			return nil, cfg.errf("lease.tls", "%v", err)
		}
		gc.ClientTLS = lc.ClientTLS
	}
	return gc, nil
}

// countReloads registers weir_daemon_reloads_total with both results at
// zero, so that a dashboard sees the series before the first reload.
func (d *daemon) countReloads(reg *prometheus.Registry) {
	d.reloads = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "weir_daemon_reloads_total",
		Help: "Reloads of the envoy descriptor files (on SIGHUP, or on a change in their directories), by result: ok, or error (the files in force stay). Each content is counted once; the load at start is not counted."}, []string{"result"})
	d.reloads.WithLabelValues("ok")
	d.reloads.WithLabelValues("error")
	reg.MustRegister(d.reloads)
}

// serveRLS starts the Envoy rate limit service on ln with the descriptors
// in force (d.envoy), registers its metrics, and, when descriptor files are
// served, watches their directories for the changes that trigger a reload.
func (d *daemon) serveRLS(st *startup, reg *prometheus.Registry, ln net.Listener) error {
	cfg := d.cfg
	d.rlsSrv = grpc.NewServer(rls.ServerOptions()...)
	d.rls = rls.New(d.node, d.envoy, cfg.Envoy.rlsOptions()...)
	d.rls.Register(d.rlsSrv)
	reg.MustRegister(d.rls.Collector())
	if cfg.servesEnvoy() {
		var err error
		if d.watch, err = watchDirs(cfg.envoyWatchDirs(), 0, cfg.Envoy.Poll); err != nil {
			return cfg.errf("envoy.directory", "%v", err)
		}
		st.onFail(d.watch.Close)
	}
	d.servers++
	go func() { d.served <- d.rlsSrv.Serve(ln) }()
	return nil
}

// serveHTTP starts the operators' listener on ln (admin API, metrics,
// status page), over TLS when http.tls is set.
func (d *daemon) serveHTTP(reg *prometheus.Registry, ln net.Listener) error {
	cfg := d.cfg
	d.httpSrv = &http.Server{Handler: d.mux(reg), ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(d.log.Handler(), slog.LevelWarn)}
	if t := cfg.HTTP.TLS; t != nil {
		var err error
		if d.httpSrv.TLSConfig, err = serverTLS(t, false); err != nil {
			return cfg.errf("http.tls", "%v", err)
		}
		d.addrs.HTTPS = true
	}
	d.servers++
	go func() {
		if d.httpSrv.TLSConfig != nil {
			d.served <- d.httpSrv.ServeTLS(ln, "", "")
		} else {
			d.served <- d.httpSrv.Serve(ln)
		}
	}()
	return nil
}

// reload reads the envoy descriptor files again and, when they changed and
// compile, serves them: what SIGHUP and a change in their directories do
// (trigger says which, for the log). Nothing is half-applied: on any error
// the files in force stay, the error names the file, line and field, and
// it is counted and logged, once per distinct content (SIGHUP logs it
// again, uncounted). Files that did not change since they were served are
// not loaded again. Rules from rules.file need no signal (the node watches
// that file); rules from the lease group change through the rules API.
//
// The switch never leaves a descriptor pointing at a rule the node does not
// hold: the node first takes the union of the old and new rules, then the
// service switches to the new descriptors, then the node drops the rules
// only the old ones used. Limits of a rule that stays keep their buckets.
func (d *daemon) reload(trigger string) error {
	d.reloadMu.Lock()
	defer d.reloadMu.Unlock()
	if d.envoy == nil || d.rls == nil {
		d.log.Info("reload: no envoy descriptors to read again (rules.file is watched without a signal)")
		return nil
	}
	files, err := d.cfg.readEnvoyFiles()
	var digest [sha256.Size]byte
	if err != nil {
		digest = sha256.Sum256([]byte("read error: " + err.Error()))
	} else {
		digest = files.digest
	}
	switch digest {
	case d.inForce:
		if trigger == "signal" {
			d.log.Info("reload: the envoy descriptor files are unchanged")
		}
		return nil
	case d.refused:
		if err == nil {
			_, err = d.cfg.compileEnvoy(files)
		}
		if trigger == "signal" {
			d.log.Error("reload refused, as before: the descriptors in force stay", "trigger", trigger, "err", err)
		}
		return err
	}
	if err == nil {
		err = d.reloadEnvoy(files)
	}
	if err != nil {
		d.refused = digest
		d.reloads.WithLabelValues("error").Inc()
		d.log.Error("reload refused: the descriptors in force stay", "trigger", trigger, "err", err)
		return err
	}
	d.inForce, d.refused = digest, [sha256.Size]byte{}
	d.reloads.WithLabelValues("ok").Inc()
	return nil
}

// warnSkipped logs the entries of envoy.directory that are not read.
func (d *daemon) warnSkipped(files *envoyFiles) {
	if len(files.skipped) > 0 {
		d.log.Warn("envoy.directory: entries that are not descriptor files (*.yaml, *.yml) are not read",
			"directory", d.cfg.Envoy.Directory, "skipped", files.skipped)
	}
}

func (d *daemon) reloadEnvoy(files *envoyFiles) error {
	next, err := d.cfg.compileEnvoy(files)
	if err != nil {
		return err
	}
	rules := next.Rules()
	kept := make(map[string]bool, len(rules))
	for _, r := range rules {
		kept[r.ID] = true
	}
	union := slices.Clone(rules)
	for _, r := range d.envoy.Rules() {
		if !kept[r.ID] {
			union = append(union, r)
		}
	}
	if err := d.node.SetRules(union); err != nil {
		return fmt.Errorf("envoy.descriptors: %w", err)
	}
	d.rls.SetConfig(next)
	if len(union) != len(rules) {
		if err := d.node.SetRules(rules); err != nil {
			// The union is in force and the service serves next: the
			// old rules are merely unused. Said, not hidden.
			d.envoy = next
			return fmt.Errorf("envoy.descriptors: the new descriptors are served, but dropping the rules only the old ones used failed: %w", err)
		}
	}
	d.envoy = next
	d.warnSkipped(files)
	d.log.Info("reloaded the envoy descriptors", "files", len(files.files), "rules", len(rules),
		"rules_version", d.node.Status().RulesVersion)
	return nil
}

// mux is the operators' HTTP routes.
func (d *daemon) mux(reg *prometheus.Registry) http.Handler {
	n := d.node
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		if d.draining.Load() {
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	// Readiness: a node that still enforces its default rules (the rule
	// file could not be read, or the lease group's rules have not arrived
	// yet) should not get traffic from a load balancer.
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		switch {
		case d.draining.Load():
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
		case n.Status().UsingDefaultRules:
			http.Error(w, "enforcing the default rules: the configured rule set is not loaded yet", http.StatusServiceUnavailable)
		default:
			fmt.Fprintln(w, "ready")
		}
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("/ops/", http.StripPrefix("/ops", ops.UIHandler(n)))
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/ops/", http.StatusFound) })
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(ops.Overview(n))
	})
	mux.Handle("GET /v1/identities/", ops.IdentityHandler(n))
	mux.Handle("/v1/rules", ops.RulesAdminHandler(n))
	mux.Handle("/v1/rules/", ops.RulesAdminHandler(n))
	mux.Handle("GET /admin/report", ops.AdminHandler(n))
	return mux
}

// shutdown stops accepting RLS calls and HTTP requests (those in flight
// get cfg.Shutdown.Drain to finish), then closes the node: it hands the
// buckets it owns to their next owners, reports its unconfirmed spend and
// leaves gossip. It is idempotent.
func (d *daemon) shutdown() error {
	d.stopOnce.Do(func() { d.stopErr = d.stop() })
	return d.stopErr
}

func (d *daemon) stop() error {
	d.draining.Store(true)
	if d.watch != nil {
		d.watch.Close()
	}
	drain := d.cfg.Shutdown.Drain
	ctx, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	stopped := make(chan struct{})
	go func() {
		if d.rlsSrv != nil {
			d.rlsSrv.GracefulStop()
		}
		close(stopped)
	}()
	httpErr := d.httpSrv.Shutdown(ctx)
	select {
	case <-stopped:
	case <-ctx.Done():
		if d.rlsSrv != nil {
			d.rlsSrv.Stop()
		}
		<-stopped
	}
	if httpErr != nil {
		d.log.Warn("HTTP requests cut off at the drain bound", "drain", drain, "err", httpErr)
		d.httpSrv.Close()
	}
	for range d.servers {
		if err := <-d.served; err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, grpc.ErrServerStopped) {
			d.log.Warn("server stopped with an error", "err", err)
		}
	}
	return d.node.Close()
}

// serve runs a daemon until ctx is done, then shuts it down. ready, when
// set, is called with the bound addresses once everything serves.
//
// Every value received on reload (SIGHUP) reads the envoy descriptor files
// again (daemon.reload).
func serve(ctx context.Context, cfg *Config, log *slog.Logger, ready func(Addrs), reload <-chan os.Signal) error {
	d, err := startDaemon(cfg, log)
	if err != nil {
		return err
	}
	log.Info("weir serving", "name", d.addrs.Name, "region", d.addrs.Region, "http", d.addrs.HTTP, "rls", d.addrs.RLS,
		"gossip", d.addrs.Gossip, "lease_rpc", d.addrs.LeaseRPC)
	if ready != nil {
		ready(d.addrs)
	}
	var failed error
	var changed <-chan struct{}
	var watchErrs <-chan error
	if d.watch != nil {
		changed, watchErrs = d.watch.Changed(), d.watch.Errors()
	}
wait:
	for {
		select {
		case <-ctx.Done():
			break wait
		case s := <-reload:
			log.Info("signal: reloading the envoy descriptors", "signal", s.String())
			_ = d.reload("signal") // logged and counted; the old files stay on error
		case <-changed:
			_ = d.reload("change") // the same; nothing happens when the files did not change
		case err := <-watchErrs:
			log.Warn("watching the envoy descriptor files failed; they are still read every envoy.poll", "err", err)
		case failed = <-d.served: // a listener failed: shut the rest down, exit 1
			d.servers--
			if failed == nil {
				failed = errors.New("a server stopped unexpectedly")
			}
			log.Error("a server stopped: shutting down", "err", failed)
			break wait
		}
	}
	log.Info("shutting down: draining RLS and HTTP, then handing off and leaving the cluster")
	start := time.Now()
	err = d.shutdown()
	log.Info("stopped", "took", time.Since(start).Round(time.Millisecond), "err", err)
	return errors.Join(failed, err)
}

// joinList is a flag that may be repeated and takes comma-separated lists.
type joinList []string

func (j *joinList) String() string { return strings.Join(*j, ",") }

func (j *joinList) Set(v string) error {
	for s := range strings.SplitSeq(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*j = append(*j, s)
		}
	}
	return nil
}

const serveUsage = `Usage: weir serve [--config weir.yaml] [flags]

Runs one weir node: Envoy's rate-limit service (when envoy descriptors are
configured), the admin API, /metrics, /healthz, /readyz and the status page (/ops/).
Flags override the config file's fields. SIGTERM or SIGINT shuts it down
gracefully (exit 0); a second signal exits at once. SIGHUP reads the envoy
descriptor files again and serves them if they are valid; so does a change
in envoy.directory or in a descriptor file's directory (the rules file is
watched too).

Flags:
`

// cmdServe is `weir serve`.
func cmdServe(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("weir serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, serveUsage); fs.PrintDefaults() }
	var o Overrides
	path := fs.String("config", "", "the config file (YAML; see docs/weir.md)")
	fs.StringVar(&o.Name, "name", "", "node name (node.name)")
	fs.StringVar(&o.Region, "region", "", "region (node.region)")
	fs.StringVar(&o.Gossip, "gossip", "", "gossip bind address host:port (gossip.bind); makes the node a cluster member")
	fs.Var((*joinList)(&o.Join), "join", "gossip address of a member to join (gossip.join); repeat or comma-separate")
	fs.StringVar(&o.RPC, "rpc", "", "peer RPC address host:port (peer.rpc)")
	fs.StringVar(&o.HTTP, "http", "", "admin/metrics/status HTTP address host:port (http.listen)")
	fs.StringVar(&o.RLS, "rls", "", "Envoy rate-limit service gRPC address host:port (envoy.listen)")
	fs.StringVar(&o.Rules, "rules", "", "rules file, watched for changes (rules.file)")
	check := fs.Bool("check", false, "validate the config and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "weir serve: unexpected argument %q\n", fs.Arg(0))
		fs.Usage()
		return 2
	}
	cfg, err := loadConfig(*path, o)
	if err != nil {
		fmt.Fprintf(stderr, "weir serve: invalid configuration:\n%v\n", err)
		return 1
	}
	if *check {
		fmt.Fprintln(stdout, "configuration ok")
		return 0
	}
	log := newLogger(cfg.Log, stderr)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sig)
	go func() {
		s := <-sig
		log.Info("signal: shutting down gracefully (send it again to exit at once)", "signal", s.String())
		cancel()
		s = <-sig
		log.Warn("second signal: exiting at once", "signal", s.String())
		os.Exit(1)
	}()
	ready := func(a Addrs) {
		b, _ := json.Marshal(struct {
			Ready bool `json:"ready"`
			Addrs
		}{true, a})
		fmt.Fprintln(stdout, string(b))
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	if err := serve(ctx, cfg, log, ready, hup); err != nil {
		fmt.Fprintf(stderr, "weir serve: %v\n", err)
		return 1
	}
	return 0
}

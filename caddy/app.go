package weircaddy

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/quota"
)

func init() {
	caddy.RegisterModule(new(App))
}

// App is the weir app module: one per Caddy config, created by the config's
// first weir handler (it needs no configuration of its own). It decides
// when a config's weir nodes change. Caddy provisions every module of a new
// config, starts its apps, and only when all of them started does it stop
// the config that was running; so a node the running config uses changes
// only then, when the running config's weir app stops. Until then the new
// config's handlers decide with the running nodes. A config that Caddy
// refuses (an error in any module's Provision, or an app that fails to
// start) changes no running node, and caddy validate starts none.
//
// For each node id of a new config: a node that no config runs yet starts
// in Start (and closes again if the config is refused); a running node
// whose settings (rules file, identity cap, cluster) are the same is kept,
// with its buckets and its place in the ring, and the config's inline rules
// are put in force with SetRules; a running node whose settings changed
// closes (it leaves the ring, handing its buckets off) and a new one starts
// and joins. A node that the new config does not use closes.
type App struct {
	reg    *prometheus.Registry // the config's metrics registry
	log    *slog.Logger
	wants  map[string]*want
	fresh  []*entry // the entries whose nodes Start started
	made   []*entry // the entries this app created, for Cleanup
	state  appState
	regged []*entryCollector
}

type appState int

const (
	provisioned appState = iota
	started
	stopped
)

// CaddyModule returns the Caddy module information.
func (*App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "weir",
		New: func() caddy.Module { return new(App) },
	}
}

// Provision takes the config's metrics registry and logger.
func (a *App) Provision(ctx caddy.Context) error {
	a.reg = ctx.GetMetricsRegistry()
	a.log = ctx.Slogger()
	a.wants = map[string]*want{}
	return nil
}

// want is what a config's handlers ask of the node named id.
type want struct {
	id        string
	key       string       // the settings a kept node must have been started with
	rulesText string       // the inline rules as written (empty with a rules file)
	rules     []quota.Rule // the inline rules parsed
	cfg       weir.Config  // the node's config, with the files already read
}

// use records a handler's want and returns the entry it decides with. The
// handlers of one config that name the same node must agree on it.
func (a *App) use(w *want) (*entry, error) {
	if a.state != provisioned {
		return nil, errors.New("weir: the config's weir app has already started")
	}
	if o, ok := a.wants[w.id]; ok {
		if o.key != w.key || o.rulesText != w.rulesText {
			return nil, fmt.Errorf("weir %q: two handlers name this node with different settings; give every weir directive with the same id the same rules, rules_file, max_identity_bytes and cluster", w.id)
		}
		return nodes.get(w.id, nil), nil
	}
	a.wants[w.id] = w
	return nodes.get(w.id, a), nil
}

// Start starts the nodes no config runs yet. When no weir config is
// running, the config is in force at once; otherwise it is put in force
// when the running config's weir app stops (commit).
func (a *App) Start() error {
	nodes.mu.Lock()
	defer nodes.mu.Unlock()
	for _, id := range a.ids() {
		e := nodes.m[id]
		if e.node.Load() != nil {
			continue
		}
		if err := e.start(a.wants[id]); err != nil {
			a.closeFresh()
			return fmt.Errorf("weir %q: %w", id, err)
		}
		a.fresh = append(a.fresh, e)
	}
	a.state = started
	if nodes.owner == nil {
		nodes.owner = a
	} else {
		nodes.pending = a
	}
	for _, id := range a.ids() {
		c := &entryCollector{e: nodes.m[id]}
		if err := prometheus.WrapRegistererWith(prometheus.Labels{"node": id}, a.reg).Register(c); err != nil {
			a.log.Error("registering weir's metrics with Caddy's registry", "node", id, "err", err)
			continue
		}
		a.regged = append(a.regged, c)
	}
	return nil
}

// closeFresh closes the nodes Start started.
func (a *App) closeFresh() {
	for _, e := range a.fresh {
		e.close()
	}
	a.fresh = nil
}

// Stop ends the config's use of its nodes. Caddy stops a config's apps in
// three cases: its start is undone (another app failed to start), and the
// nodes Start started close; it is replaced by a newer config that started,
// which is then put in force (commit) and the nodes it does not use close;
// or no config follows, and its nodes close.
func (a *App) Stop() error {
	nodes.mu.Lock()
	defer nodes.mu.Unlock()
	for _, c := range a.regged {
		a.reg.Unregister(c)
	}
	a.regged = nil
	defer func() { a.state = stopped }()
	switch {
	case a.state != started:
	case nodes.pending == a:
		a.closeFresh()
		nodes.pending = nil
	case nodes.owner == a:
		next := nodes.pending
		if next != nil {
			next.commit()
		}
		for _, id := range a.ids() {
			if e := nodes.m[id]; e != nil && (next == nil || next.wants[id] == nil) {
				e.close()
			}
		}
		nodes.owner, nodes.pending = next, nil
	}
	return nil
}

// commit puts the started config's settings in force on the nodes it
// shares with the config it replaces. Caddy has already put the config in
// force, so what fails here is logged and the node goes on as it was.
func (a *App) commit() {
	for _, id := range a.ids() {
		w, e := a.wants[id], nodes.m[id]
		if slices.Contains(a.fresh, e) {
			continue
		}
		old := e.want
		switch {
		case old.key == w.key:
			if w.rules != nil && w.rulesText != old.rulesText {
				if err := e.node.Load().SetRules(w.rules); err != nil {
					a.log.Error("weir: the new config's rules were refused; the node's rules stay", "node", id, "err", err)
					continue
				}
			}
			e.want = w
		default:
			e.node.Load().Close()
			if err := e.start(w); err != nil {
				a.log.Error("weir: starting the node with its new settings failed; restarting it with its settings before", "node", id, "err", err)
				if err := e.start(old); err != nil {
					a.log.Error("weir: restarting the node failed; it decides alone on its last rules", "node", id, "err", err)
				}
			}
		}
	}
	a.fresh = nil
}

// Cleanup forgets the entries this app created when it never started (Caddy
// refused its config, or only validated it).
func (a *App) Cleanup() error {
	nodes.mu.Lock()
	defer nodes.mu.Unlock()
	for _, e := range a.made {
		if e.node.Load() == nil {
			e.close()
		}
	}
	return nil
}

// ids are the config's node ids in order, so that Start does the same
// things in the same order for the same config.
func (a *App) ids() []string {
	ids := make([]string, 0, len(a.wants))
	for id := range a.wants {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// entry is a node id across configs: the node running for it (nil until a
// config with the id starts) and the settings it runs with.
type entry struct {
	id      string
	node    atomic.Pointer[weir.Node]
	metrics atomic.Pointer[capture] // the running node's collectors
	ready   chan struct{}           // closed once node is set, or the entry is dropped
	want    *want                   // the settings in force; guarded by registry.mu
	once    sync.Once
}

// start starts w's node on e.
func (e *entry) start(w *want) error {
	c := new(capture)
	cfg := w.cfg
	cfg.Registerer = c
	n, err := weir.New(cfg)
	if err != nil {
		return err
	}
	e.metrics.Store(c)
	e.node.Store(n)
	e.want = w
	e.once.Do(func() { close(e.ready) })
	return nil
}

// close closes e's node and drops the entry; requests waiting on it are
// answered 503.
func (e *entry) close() {
	if n := e.node.Load(); n != nil {
		n.Close()
	}
	if nodes.m[e.id] == e {
		delete(nodes.m, e.id)
	}
	e.once.Do(func() { close(e.ready) })
}

// registry holds the node entries across config reloads, by id, and the
// apps whose configs use them. Caddy loads one config at a time.
type registry struct {
	mu      sync.Mutex
	m       map[string]*entry
	owner   *App // the weir app of the config in force
	pending *App // the weir app of a config that started and is not yet in force
}

var nodes = registry{m: map[string]*entry{}}

// get returns the entry for id, creating it (with no node yet) for the app
// maker when there is none.
func (g *registry) get(id string, maker *App) *entry {
	g.mu.Lock()
	defer g.mu.Unlock()
	if e, ok := g.m[id]; ok {
		return e
	}
	e := &entry{id: id, ready: make(chan struct{})}
	g.m[id] = e
	if maker != nil {
		maker.made = append(maker.made, e)
	}
	return e
}

// capture is the prometheus.Registerer a node registers its collectors
// with, so that each config can register them with its own registry.
type capture struct {
	mu sync.Mutex
	cs []prometheus.Collector
}

func (c *capture) Register(col prometheus.Collector) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cs = append(c.cs, col)
	return nil
}

func (c *capture) MustRegister(cols ...prometheus.Collector) {
	for _, col := range cols {
		_ = c.Register(col)
	}
}

func (c *capture) Unregister(col prometheus.Collector) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := slices.Index(c.cs, col)
	if i < 0 {
		return false
	}
	c.cs = slices.Delete(c.cs, i, i+1)
	return true
}

func (c *capture) collectors() []prometheus.Collector {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.cs)
}

// entryCollector collects the metrics of the node running for an entry,
// whichever node that is.
type entryCollector struct{ e *entry }

func (c *entryCollector) Describe(ch chan<- *prometheus.Desc) {
	if m := c.e.metrics.Load(); m != nil {
		for _, col := range m.collectors() {
			col.Describe(ch)
		}
	}
}

func (c *entryCollector) Collect(ch chan<- prometheus.Metric) {
	if m := c.e.metrics.Load(); m != nil {
		for _, col := range m.collectors() {
			col.Collect(ch)
		}
	}
}

// Interface guards.
var (
	_ caddy.App          = (*App)(nil)
	_ caddy.Provisioner  = (*App)(nil)
	_ caddy.CleanerUpper = (*App)(nil)
)

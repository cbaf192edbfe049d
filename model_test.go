package weir_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/quota"
)

// TestModel drives a single Node (fake clock) and the reference limiter of
// model_ref_test.go with the same random operation sequences, and requires
// every decision of the Node to equal the reference's, or to differ only
// within the key cap's documented bound (an identity evicted at the cap
// regains at most what it had spent, and only a full or least indebted
// bucket is evicted: docs/security.md, docs/overshoot.md).
//
// The operations, each in some of the subtests' configurations:
//   - a request through Node.Allow: random method (GET, POST, post), path
//     (exact, prefix, pattern, unclean), cost (the rule's, cost_by_method,
//     or Request.Cost up to above the burst), X-Api-Key and X-User headers,
//     user, client IP (IPv4, IPv6, none) and tier; several rules may match;
//     every rule's verdict, remaining tokens, lock-out and delay are
//     compared, and the request's;
//   - the same request through Node.Middleware (httptest): 429 or not, the
//     violated rules and their lock-out from the problem body, the rules'
//     results from FromContext when the upstream is called;
//   - Decision.Done on a held decision (concurrency slots released);
//   - the fake clock advanced by a random step (0 to 16 minutes);
//   - SetRules with one to three changes to the rules in force: limit,
//     burst and window raised or lowered, the algorithm changed (gcra,
//     fixed_window, sliding_window, sliding_log, leaky_bucket,
//     concurrency), max_delay, cost and cost_by_method, match, overrides
//     and tiers added, changed and removed, shadow toggled, penalty added,
//     changed and removed, rules added and removed (a removed and re-added
//     rule is a new incarnation);
//   - the same changes through a rules-file reload (the file rewritten, the
//     watcher's new version awaited), and invalid files refused;
//   - key-cap pressure: a burst of never-repeated client IPs, one request
//     each, against a small Config.MaxKeys.
//
// Not generated: a change of a rule's key chain, a window change of a
// sliding_window rule (its semantics are a reading rule of docs/rules.md
// that the reference does not model), a change to or from concurrency
// while a held decision has a slot of it, and identities over
// MaxIdentityBytes.
//
// A failure prints rapid's seed and the shortest sequence it found (rerun
// with -rapid.seed). By default each subtest runs a few seconds; with
// WEIR_MODEL=long each runs for WEIR_MODEL_TIME (default 10m) divided
// among the subtests:
//
//	WEIR_MODEL=long WEIR_MODEL_TIME=10m go test -run TestModel -timeout 0 .
//
// The subtests: "plain" (requests, Done and clock steps, through Allow and
// the middleware, identities that never share text across sources), "rules" (rule changes by SetRules, identities that never
// share text across sources), "identities" (identity chains whose sources
// share text, through Allow and the middleware, no rule changes), "keycap"
// (key-cap pressure, no rule changes), "file" (rule changes by file
// reload, through the middleware too), "all" (every operation).
func TestModel(t *testing.T) {
	configs := []modelConfig{
		{name: "plain", http: true, checks: 100},
		{name: "rules", setRules: true, checks: 100},
		{name: "identities", overlap: true, http: true, checks: 100},
		{name: "keycap", rotate: true, checks: 50},
		{name: "file", file: true, http: true, checks: 5},
		{name: "all", setRules: true, file: true, overlap: true, http: true, rotate: true, checks: 10},
	}
	long := os.Getenv("WEIR_MODEL") == "long"
	total := 10 * time.Minute
	if s := os.Getenv("WEIR_MODEL_TIME"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("WEIR_MODEL_TIME: %v", err)
		}
		total = d
	}
	for _, cfg := range configs {
		t.Run(cfg.name, func(t *testing.T) {
			if !long {
				withRapidChecks(t, cfg.checks)
				rapid.Check(t, func(rt *rapid.T) { runModel(rt, cfg) })
				return
			}
			setFlag(t, "rapid.nofailfile", "true")
			end := time.Now().Add(total / time.Duration(len(configs)))
			for time.Now().Before(end) && !t.Failed() {
				rapid.Check(t, func(rt *rapid.T) { runModel(rt, cfg) })
			}
		})
	}
}

// withRapidChecks sets -rapid.checks for one subtest unless the command
// line set it, and -rapid.nofailfile (a failure prints its seed; no file
// is left in testdata).
func withRapidChecks(t *testing.T, n int) {
	setFlag(t, "rapid.checks", fmt.Sprint(n))
	setFlag(t, "rapid.nofailfile", "true")
}

func setFlag(t *testing.T, name, v string) {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	if set {
		return
	}
	f := flag.Lookup(name)
	old := f.Value.String()
	if err := f.Value.Set(v); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Value.Set(old) })
}

// modelConfig selects the operations of one model run.
type modelConfig struct {
	name     string
	setRules bool // rule changes through SetRules
	file     bool // rule changes through a rules-file reload
	overlap  bool // identity values shared by headers, users and IPs
	http     bool // requests through the middleware too
	rotate   bool // key-cap pressure
	checks   int
}

// The key cap under pressure: 4 keys per shard of the gcra store (256
// shards), 16 per shard of the others (64 shards); a rotation inserts more
// identities than the whole cap, so that the entries an eviction examines
// are mostly rotating ones. At most modelRotations rotations per check.
const (
	modelMaxKeys   = 1024
	modelRotate    = 1300
	modelRotations = 6
)

// modelMachine is one Node and its reference.
type modelMachine struct {
	cfg   modelConfig
	n     *weir.Node
	clk   *fakeClock
	ref   *refLimiter
	rules []quota.Rule
	file  string
	// written is the content of the rules file the Node last read: the
	// watcher applies the file when its content changes, so writing the
	// same content again after a SetRules changes nothing (docs/rules.md).
	written string
	held    []heldDecision
	ids     int // rotating identities so far
	fail    func(format string, args ...any)
	logf    func(format string, args ...any)
}

// heldDecision is an admitted request whose concurrency slots are not yet
// released.
type heldDecision struct {
	d     weir.Decision
	slots []heldSlot
}

type heldSlot struct {
	key   refKey
	cost  int64
	epoch int
}

// fataler is what newModelMachine needs of a test: *testing.T and *rapid.T.
type fataler interface {
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

func newModelMachine(tb fataler, cfg modelConfig, rules []quota.Rule, seed uint64,
	fail, logf func(string, ...any)) *modelMachine {
	m := &modelMachine{cfg: cfg, clk: newFakeClock(), ref: newRefLimiter(), fail: fail, logf: logf}
	wc := weir.Config{Clock: m.clk.Now, HashSeed: seed, Logger: slog.New(slog.DiscardHandler), // refused reloads are expected
		UserFunc: func(r *http.Request) string { return r.Header.Get("X-Model-User") },
		TierFunc: func(r *http.Request) string { return r.Header.Get("X-Model-Tier") }}
	if cfg.rotate {
		wc.MaxKeys = modelMaxKeys
	}
	if cfg.file {
		dir, err := os.MkdirTemp("", "weir-model-")
		if err != nil {
			tb.Fatal(err)
		}
		m.file = filepath.Join(dir, "rules.yaml")
		m.written = modelRulesYAML(rules)
		if err := os.WriteFile(m.file, []byte(m.written), 0o600); err != nil {
			tb.Fatal(err)
		}
		parsed, err := quota.Parse("rules.yaml", []byte(modelRulesYAML(rules)))
		if err != nil {
			tb.Fatalf("the model's rules do not parse: %v\n%s", err, modelRulesYAML(rules))
		}
		rules = parsed
		wc.RulesFile, wc.ReloadPoll = m.file, 20*time.Millisecond
	} else {
		wc.Rules = rules
	}
	n, err := weir.New(wc)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	m.n = n
	m.rules = rules
	m.ref.install(rules, m.now())
	logf("rules: %s", describeRules(rules))
	return m
}

func (m *modelMachine) close() {
	for i := range m.held {
		m.held[i].d.Done()
	}
	m.n.Close()
	if m.file != "" {
		os.RemoveAll(filepath.Dir(m.file))
	}
}

func (m *modelMachine) now() int64 { return m.clk.Now().UnixNano() }

// modelReq is one generated request.
type modelReq struct {
	method, path       string
	apiKey, xUser      string
	user, ip, tier     string
	cost               int64
	viaHTTP, keepSlots bool
}

func (q modelReq) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", q.method, q.path)
	for _, kv := range [][2]string{{"X-Api-Key", q.apiKey}, {"X-User", q.xUser}, {"user", q.user}, {"ip", q.ip}, {"tier", q.tier}} {
		if kv[1] != "" {
			fmt.Fprintf(&b, " %s=%s", kv[0], kv[1])
		}
	}
	if q.cost > 0 {
		fmt.Fprintf(&b, " cost=%d", q.cost)
	}
	if q.viaHTTP {
		b.WriteString(" (middleware)")
	}
	return b.String()
}

func (q modelReq) ref() *refRequest {
	r := &refRequest{method: q.method, path: q.path, header: map[string]string{}, user: q.user, ip: q.ip, tier: q.tier, cost: q.cost}
	if q.apiKey != "" {
		r.header["X-Api-Key"] = q.apiKey
	}
	if q.xUser != "" {
		r.header["X-User"] = q.xUser
	}
	if q.viaHTTP {
		r.path = cleanRefPath(q.path)
		r.cost = 0
	}
	return r
}

// request sends q to the Node, checks its answer against the reference and
// returns whether the Node admitted it.
func (m *modelMachine) request(q modelReq) (allowed bool) {
	rq := q.ref()
	out := m.ref.expect(rq, m.now())
	var node []nodeRule
	var held *heldDecision
	if q.viaHTTP {
		allowed, node = m.viaHTTP(q, out)
	} else {
		h := http.Header{}
		if q.apiKey != "" {
			h.Set("X-Api-Key", q.apiKey)
		}
		if q.xUser != "" {
			h.Set("X-User", q.xUser)
		}
		d := m.n.Allow(context.Background(), weir.Request{Method: q.method, Path: q.path, Header: h,
			User: q.user, ClientIP: q.ip, Tier: q.tier, Cost: q.cost})
		if d.Err != nil {
			m.fail("%v: Allow: %v", q, d.Err)
			return false
		}
		allowed = d.Allowed
		rs := d.Results()
		var got, want []string
		for _, r := range rs {
			got = append(got, r.Rule)
		}
		for _, ro := range out.rules {
			want = append(want, ro.rule)
		}
		if !slices.Equal(got, want) {
			m.fail("%v: the Node applied rules %v, the reference %v", q, got, want)
			return false
		}
		for _, r := range rs {
			node = append(node, nodeRule{known: true, allowed: r.Allowed && !r.ShadowRejected, locked: r.Locked,
				remaining: r.Remaining, delay: int64(r.Delay), raw: fmt.Sprintf("%+v", r)})
		}
		held = &heldDecision{d: d}
	}
	if msg := m.ref.apply(out, allowed, node); msg != "" {
		m.fail("%v at %v: %s", q, time.Duration(m.now()%int64(time.Hour)), msg)
		return allowed
	}
	m.logf("%v → allowed=%v", q, allowed)
	if held == nil {
		held = &heldDecision{} // the middleware released its slots at the request's end
	}
	for _, ro := range out.rules {
		if c := m.ref.cands[ro.key]; allowed && !ro.locked && len(c) > 0 && c[0].p.alg == quota.AlgorithmConcurrency && ro.verdicts[0].allowed {
			held.slots = append(held.slots, heldSlot{key: ro.key, cost: ro.cost, epoch: c[0].epoch})
		}
	}
	if len(held.slots) == 0 {
		return allowed
	}
	if q.viaHTTP {
		for _, s := range held.slots {
			m.ref.release(s.key, s.cost, s.epoch)
		}
		return allowed
	}
	if q.keepSlots {
		m.held = append(m.held, *held)
		return allowed
	}
	m.release(held)
	return allowed
}

func (m *modelMachine) release(h *heldDecision) {
	h.d.Done()
	for _, s := range h.slots {
		m.ref.release(s.key, s.cost, s.epoch)
	}
}

// viaHTTP sends q through the middleware; the rules' verdicts are read from
// the upstream's FromContext, else from the problem body.
func (m *modelMachine) viaHTTP(q modelReq, out *outcome) (bool, []nodeRule) {
	var seen *weir.Decision
	var rs []weir.RuleResult
	h := m.n.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen, _ = weir.FromContext(r.Context())
		rs = append(rs, seen.Results()...)
		w.WriteHeader(http.StatusNoContent)
	}))
	req := httptest.NewRequest(q.method, "http://example.test"+q.path, nil)
	if strings.HasPrefix(q.path, "//") || strings.Contains(q.path, "/.") {
		req.URL.Path = q.path // as sent, not as httptest parsed it
	}
	if q.apiKey != "" {
		req.Header.Set("X-Api-Key", q.apiKey)
	}
	if q.xUser != "" {
		req.Header.Set("X-User", q.xUser)
	}
	if q.user != "" {
		req.Header.Set("X-Model-User", q.user)
	}
	if q.tier != "" {
		req.Header.Set("X-Model-Tier", q.tier)
	}
	req.RemoteAddr = ""
	if q.ip != "" {
		if strings.Contains(q.ip, ":") {
			req.RemoteAddr = "[" + q.ip + "]:4711"
		} else {
			req.RemoteAddr = q.ip + ":4711"
		}
	}
	// A leaky bucket's delay would be waited out in real time: the request's
	// context is already over, so the middleware returns at once.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req.WithContext(ctx))
	node := make([]nodeRule, len(out.rules))
	switch {
	case seen != nil:
		for i := range node {
			if i < len(rs) {
				r := rs[i]
				node[i] = nodeRule{known: true, allowed: r.Allowed && !r.ShadowRejected, locked: r.Locked, remaining: r.Remaining, delay: int64(r.Delay), raw: fmt.Sprintf("%+v", r)}
				if r.Rule != out.rules[i].rule {
					m.fail("%v: the middleware's decision lists rule %s where the reference has %s", q, r.Rule, out.rules[i].rule)
				}
			}
		}
		if len(rs) != len(out.rules) {
			m.fail("%v: the middleware's decision has %d rules, the reference %d", q, len(rs), len(out.rules))
		}
		return true, node
	case rec.Code == http.StatusTooManyRequests:
		var body struct {
			Violated []struct {
				Rule      string `json:"rule"`
				LockedOut bool   `json:"locked_out"`
			} `json:"violated_rules"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			m.fail("%v: 429 body: %v", q, err)
		}
		for i, ro := range out.rules {
			if ro.shadow {
				continue
			}
			node[i] = nodeRule{known: true, allowed: true, remaining: -1, delay: -1}
			for _, v := range body.Violated {
				if v.Rule == ro.rule {
					node[i] = nodeRule{known: true, locked: v.LockedOut, remaining: -1}
				}
			}
		}
		return false, node
	case rec.Code == http.StatusOK && rec.Body.Len() == 0:
		// Admitted with a delay the cancelled context cut short.
		for i, ro := range out.rules {
			if !ro.shadow {
				node[i] = nodeRule{known: true, allowed: true, remaining: -1, delay: -1}
			}
		}
		return true, node
	default:
		m.fail("%v: the middleware answered %d: %s", q, rec.Code, rec.Body.String())
		return false, node
	}
}

// setRules installs rules through SetRules or the rules file.
func (m *modelMachine) setRules(rules []quota.Rule, viaFile bool) {
	if viaFile {
		m.reload(rules)
		return
	}
	if err := m.n.SetRules(rules); err != nil {
		m.logf("SetRules refused: %v", err)
		return
	}
	m.rules = rules
	m.ref.install(rules, m.now())
	m.logf("SetRules at %v: %s", time.Duration(m.now()%int64(time.Hour)), describeRules(rules))
}

// reload writes rules to the rules file and waits for the Node to install
// them (or to refuse them).
func (m *modelMachine) reload(rules []quota.Rule) {
	y := modelRulesYAML(rules)
	parsed, err := quota.Parse("rules.yaml", []byte(y))
	var want string
	if err == nil {
		var set *quota.Set
		if set, err = quota.NewSet(parsed, 1); err == nil {
			want = set.Digest()
		}
	}
	if err != nil {
		m.logf("rules file not valid, not written: %v", err)
		return
	}
	if want == m.n.Rules().Digest() {
		m.rules = parsed
		m.ref.install(parsed, m.now())
		return
	}
	if y == m.written {
		m.logf("rules file rewritten unchanged: the rules SetRules put in force stay")
		return
	}
	if err := os.WriteFile(m.file, []byte(y), 0o600); err != nil {
		m.fail("writing the rules file: %v", err)
		return
	}
	m.written = y
	deadline := time.Now().Add(10 * time.Second)
	for m.n.Rules().Digest() != want {
		if time.Now().After(deadline) {
			m.fail("the rules file reload was not installed within 10s (status %+v)", m.n.Status())
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	m.rules = parsed
	m.ref.install(parsed, m.now())
	m.logf("rules file reloaded at %v: %s", time.Duration(m.now()%int64(time.Hour)), describeRules(parsed))
}

// reloadInvalid writes an invalid rules file and waits for the Node to
// refuse it; the rules in force stay.
func (m *modelMachine) reloadInvalid() {
	if m.n.Status().LastReloadError != "" {
		return
	}
	const broken = "rules:\n  - id: broken\n    limit: 0\n    window: 1m\n"
	if err := os.WriteFile(m.file, []byte(broken), 0o600); err != nil {
		m.fail("writing the rules file: %v", err)
		return
	}
	m.written = broken
	deadline := time.Now().Add(10 * time.Second)
	for m.n.Status().LastReloadError == "" {
		if time.Now().After(deadline) {
			m.fail("an invalid rules file was not reported within 10s")
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	m.logf("invalid rules file refused: %s", m.n.Status().LastReloadError)
}

func (m *modelMachine) advance(d time.Duration) {
	m.clk.Advance(d)
	m.logf("advance %v", d)
}

// rotate sends k never-repeated client IPs, one request of cost 1 each.
func (m *modelMachine) rotate(k int, path string) {
	for range k {
		m.ids++
		ip := fmt.Sprintf("10.%d.%d.%d", m.ids>>16&255, m.ids>>8&255, m.ids&255)
		q := modelReq{method: http.MethodGet, path: path, ip: ip, cost: 1}
		out := m.ref.expect(q.ref(), m.now())
		d := m.n.Allow(context.Background(), weir.Request{Method: q.method, Path: q.path, ClientIP: ip, Cost: 1})
		var node []nodeRule
		for _, r := range d.Results() {
			node = append(node, nodeRule{known: true, allowed: r.Allowed && !r.ShadowRejected, locked: r.Locked, remaining: r.Remaining, delay: int64(r.Delay), raw: fmt.Sprintf("%+v", r)})
		}
		if len(node) != len(out.rules) {
			m.fail("%v: the Node applied %d rules, the reference %d", q, len(node), len(out.rules))
			return
		}
		if msg := m.ref.apply(out, d.Allowed, node); msg != "" {
			m.fail("%v (rotating identity %d): %s", q, m.ids, msg)
			return
		}
		h := heldDecision{d: d}
		for _, ro := range out.rules {
			if c := m.ref.cands[ro.key]; len(c) == 1 && ro.key.id != "" {
				m.ref.noteFlood(c[0], m.now()) // not the "" bucket: it is not one of the rotating identities
			}
			if c := m.ref.cands[ro.key]; d.Allowed && !ro.locked && len(c) > 0 && c[0].p.alg == quota.AlgorithmConcurrency && ro.verdicts[0].allowed {
				h.slots = append(h.slots, heldSlot{key: ro.key, cost: ro.cost, epoch: c[0].epoch})
			}
		}
		m.release(&h)
	}
	m.ref.prune(m.now())
	m.logf("rotated %d identities on %s", k, path)
}

// runModel is one rapid check: a Node, its reference, and a sequence of
// operations drawn according to cfg.
func runModel(t *rapid.T, cfg modelConfig) {
	g := newModelGen(cfg)
	rules := g.ruleSet(t)
	seed := rapid.Uint64Range(1, 1<<62).Draw(t, "hashSeed")
	m := newModelMachine(t, cfg, rules, seed, t.Fatalf, t.Logf)
	defer m.close()
	actions := map[string]func(*rapid.T){
		"allow": func(t *rapid.T) { m.request(g.request(t, false)) },
		"advance": func(t *rapid.T) {
			m.advance(rapid.SampledFrom([]time.Duration{0, time.Millisecond, 250 * time.Millisecond, time.Second,
				3 * time.Second, 10 * time.Second, time.Minute, 4 * time.Minute, 16 * time.Minute}).Draw(t, "step"))
		},
		"done": func(t *rapid.T) {
			if len(m.held) == 0 {
				t.Skip("nothing held")
			}
			i := rapid.IntRange(0, len(m.held)-1).Draw(t, "held")
			m.release(&m.held[i])
			m.held = slices.Delete(m.held, i, i+1)
			m.logf("done %d", i)
		},
	}
	if cfg.http {
		actions["http"] = func(t *rapid.T) { m.request(g.request(t, true)) }
	}
	if cfg.setRules {
		actions["setRules"] = func(t *rapid.T) { m.setRules(g.mutate(t, m.rules, m.heldConcurrency()), false) }
	}
	if cfg.file {
		actions["reload"] = func(t *rapid.T) {
			if rapid.IntRange(0, 5).Draw(t, "invalid") == 0 {
				m.reloadInvalid()
				return
			}
			m.setRules(g.mutate(t, m.rules, m.heldConcurrency()), true)
		}
	}
	if cfg.rotate {
		actions["rotate"] = func(t *rapid.T) {
			if m.ids >= modelRotations*modelRotate {
				t.Skip("enough rotations")
			}
			m.rotate(modelRotate, rapid.SampledFrom(g.paths).Draw(t, "path"))
		}
	}
	t.Repeat(actions)
}

// heldConcurrency lists the rules some held decision has a slot of.
func (m *modelMachine) heldConcurrency() map[string]bool {
	out := map[string]bool{}
	for _, h := range m.held {
		for _, s := range h.slots {
			out[s.key.rule] = true
		}
	}
	return out
}

package weircaddy_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/caddyhttp"
	_ "github.com/caddyserver/caddy/v2/modules/caddyhttp/caddyauth"
	_ "github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	_ "github.com/caddyserver/caddy/v2/modules/metrics"
	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/caddy"
	"github.com/weir-dev/weir/lease"
	"github.com/weir-dev/weir/lease/raftgroup"
	"github.com/weir-dev/weir/ops"
	"github.com/weir-dev/weir/quota"
	"golang.org/x/crypto/bcrypt"
)

// global keeps the tests' Caddy away from the admin endpoint, ACME and the
// autosaved config.
const global = "{\n\tadmin off\n\tauto_https off\n\tpersist_config off\n}\n"

// adapt turns a Caddyfile into Caddy's JSON with Caddy's own adapter.
func adapt(caddyfile string) ([]byte, error) {
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), map[string]any{"filename": "Caddyfile"})
	return cfg, err
}

// load puts a Caddyfile in force in this process's Caddy, as `caddy reload`
// does, stopping Caddy when the test ends.
func load(t testing.TB, caddyfile string) {
	t.Helper()
	cfg, err := adapt(caddyfile)
	if err != nil {
		t.Fatalf("adapting the Caddyfile: %v\n%s", err, caddyfile)
	}
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatalf("loading the config: %v\n%s", err, caddyfile)
	}
	t.Cleanup(func() { caddy.Stop() })
}

// loadForever is load for the benchmark's Caddy, which runs until the
// process ends.
func loadForever(t testing.TB, caddyfile string) {
	t.Helper()
	cfg, err := adapt(caddyfile)
	if err != nil {
		t.Fatalf("adapting the Caddyfile: %v\n%s", err, caddyfile)
	}
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatalf("loading the config: %v\n%s", err, caddyfile)
	}
}

// freePorts returns n loopback ports free at the time of the call.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

type answer struct {
	code   int
	header http.Header
	body   string
}

var client = &http.Client{Timeout: 5 * time.Second}

func get(t testing.TB, port int, key string) answer {
	t.Helper()
	req, err := http.NewRequest("GET", fmt.Sprintf("http://127.0.0.1:%d/", port), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-Key", key)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, string(b)}
}

// site is one server block: a weir node named id in front of a response.
func site(port int, id, weirBody, respond string) string {
	return fmt.Sprintf("http://127.0.0.1:%d {\n\tweir %s {\n%s\n\t}\n\trespond %q\n}\n", port, id, weirBody, respond)
}

const perKeyRules = `		rules <<YAML
		rules:
		  - id: per-key
		    key: [header:X-API-Key]
		    limit: 60
		    window: 1h
		    burst: 3
		YAML`

// A reload that keeps the node's settings keeps its buckets: an identity
// that spent its burst stays limited across the reload, while the reload
// did take effect (the new response body).
func TestReloadKeepsBuckets(t *testing.T) {
	p := freePorts(t, 1)[0]
	load(t, global+site(p, "reload", perKeyRules, "one"))
	var codes []int
	for range 4 {
		codes = append(codes, get(t, p, "alice").code)
	}
	if fmt.Sprint(codes) != "[200 200 200 429]" {
		t.Fatalf("before the reload: %v, want [200 200 200 429]", codes)
	}
	n1, _ := weircaddy.Node("reload")
	load(t, global+site(p, "reload", perKeyRules, "two"))
	if n2, _ := weircaddy.Node("reload"); n2 != n1 {
		t.Errorf("the reload replaced the node")
	}
	if a := get(t, p, "alice"); a.code != 429 {
		t.Errorf("after the reload alice got %d %q, want 429: the reload lost her bucket", a.code, a.body)
	}
	if a := get(t, p, "bob"); a.code != 200 || a.body != "two" {
		t.Errorf("after the reload bob got %d %q, want 200 \"two\"", a.code, a.body)
	}
	// A reload with other settings (here a cap on identities) starts a new node.
	load(t, global+site(p, "reload", perKeyRules+"\n\t\tmax_identity_bytes 64", "three"))
	if n3, _ := weircaddy.Node("reload"); n3 == n1 {
		t.Errorf("a reload with a new max_identity_bytes kept the old node")
	}
}

// A rejection answers as weir's middleware does; with handle_errors it goes
// to Caddy's error routes, the rate-limit headers already set.
func TestRejectionAndHandleErrors(t *testing.T) {
	ps := freePorts(t, 2)
	load(t, global+site(ps[0], "plain", perKeyRules, "ok")+
		fmt.Sprintf("http://127.0.0.1:%d {\n\tweir errs {\n%s\n\t\thandle_errors\n\t}\n\trespond ok\n\thandle_errors {\n\t\trespond \"limited {err.status_code}\" {err.status_code}\n\t}\n}\n", ps[1], perKeyRules))
	for range 3 {
		get(t, ps[0], "k")
		get(t, ps[1], "k")
	}
	a := get(t, ps[0], "k")
	if a.code != 429 || a.header.Get("Content-Type") != "application/problem+json" || a.header.Get("Retry-After") == "" ||
		!strings.Contains(a.body, `"violated_rules":[{"rule":"per-key"`) {
		t.Errorf("rejection: %d %v %s", a.code, a.header, a.body)
	}
	// The same requests through weir's net/http middleware.
	rules, err := quota.Parse("rules", []byte("rules:\n  - id: per-key\n    key: [header:X-API-Key]\n    limit: 60\n    window: 1h\n    burst: 3\n"))
	if err != nil {
		t.Fatal(err)
	}
	n, err := weir.New(weir.Config{Rules: rules})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	srv := httptest.NewServer(n.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))
	defer srv.Close()
	var want answer
	for range 4 {
		want = get(t, srv.Listener.Addr().(*net.TCPAddr).Port, "k")
	}
	// Date and Server are the servers' own; X-RateLimit-Reset is unix
	// seconds, a second apart when the two answers straddle one.
	for _, h := range []http.Header{a.header, want.header} {
		for _, k := range []string{"Date", "Server", "X-Ratelimit-Reset"} {
			h.Del(k)
		}
	}
	if a.code != want.code || !reflect.DeepEqual(a.header, want.header) || a.body != want.body {
		t.Errorf("Caddy answered %d %v %s\nweir's middleware %d %v %s", a.code, a.header, a.body, want.code, want.header, want.body)
	}
	b := get(t, ps[1], "k")
	if b.code != 429 || b.body != "limited 429" || b.header.Get("RateLimit") == "" || b.header.Get("Retry-After") == "" {
		t.Errorf("rejection through handle_errors: %d %v %q", b.code, b.header, b.body)
	}
}

// A Caddyfile with an error is refused with Caddy's usual message naming
// the file and line; rules that do not parse are refused when loaded.
func TestBadCaddyfile(t *testing.T) {
	_, err := adapt(global + "http://127.0.0.1:1 {\n\tweir {\n\t\tbogus 1\n\t}\n\trespond ok\n}\n")
	if err == nil || !strings.Contains(err.Error(), "Caddyfile:8") || !strings.Contains(err.Error(), `unknown subdirective "bogus"`) {
		t.Errorf("adapting a bad subdirective: %v", err)
	}
	cfg, err := adapt(global + site(freePorts(t, 1)[0], "bad", "\t\trules <<YAML\n\t\trules:\n\t\t  - id: x\n\t\t    limit: -1\n\t\tYAML", "ok"))
	if err != nil {
		t.Fatal(err)
	}
	if err := caddy.Load(cfg, true); err == nil || !strings.Contains(err.Error(), "weir") {
		t.Errorf("loading bad rules: %v, want an error naming weir", err)
	}
}

// Three Caddy servers, each with its own weir node, form one cluster (the
// second and third join the first, in reloads that keep the first's node);
// a shared per-key rule driven through all three stays within weir's
// envelope for shared rules, B + r·Δ + S (docs/overshoot.md).
func TestThreeInstanceCluster(t *testing.T) {
	ps := freePorts(t, 3)
	label := fmt.Sprintf("caddy-test-%d", time.Now().UnixNano())
	const burst, limit = 10, 60 // per minute; accuracy 0.05: S ≤ 3
	rules := fmt.Sprintf("\t\trules <<YAML\n\t\trules:\n\t\t  - id: shared-key\n\t\t    key: [header:X-API-Key]\n\t\t    limit: %d\n\t\t    window: 1m\n\t\t    burst: %d\n\t\t    mode: shared\n\t\tYAML", limit, burst)
	cluster := func(name, join string) string {
		s := fmt.Sprintf("%s\n\t\tcluster {\n\t\t\tname %s\n\t\t\tlabel %s\n\t\t\tlocal_timing\n", rules, name, label)
		if join != "" {
			s += "\t\t\tjoin " + join + "\n"
		}
		return s + "\t\t}"
	}
	load(t, global+site(ps[0], "c0", cluster("c0", ""), "ok"))
	n0, ok := weircaddy.Node("c0")
	if !ok {
		t.Fatal("no node c0")
	}
	g := ops.GossipAddr(n0)
	conf := global + site(ps[0], "c0", cluster("c0", ""), "ok")
	for i := 1; i < 3; i++ {
		conf += site(ps[i], fmt.Sprintf("c%d", i), cluster(fmt.Sprintf("c%d", i), g), "ok")
		load(t, conf)
	}
	if n, _ := weircaddy.Node("c0"); n != n0 {
		t.Fatal("adding servers replaced the first node")
	}
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; i < 3; i++ {
		n, _ := weircaddy.Node(fmt.Sprintf("c%d", i))
		for len(ops.Members(n)) < 3 {
			if time.Now().After(deadline) {
				t.Fatalf("node c%d sees members %v", i, ops.Members(n))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	start := time.Now()
	admitted := 0
	for i := range 90 {
		if get(t, ps[i%3], "tenant").code == 200 {
			admitted++
		}
	}
	elapsed := time.Since(start)
	upper := burst + int(float64(limit)*elapsed.Minutes()+0.999) + 3
	t.Logf("admitted %d of 90 through 3 servers in %v (envelope ≤ %d)", admitted, elapsed, upper)
	if admitted > upper || admitted < burst-3 {
		t.Errorf("admitted %d, want between %d and %d", admitted, burst-3, upper)
	}
}

// The complete Caddyfile of docs/caddy.md adapts, and its weir handler is
// the one the doc describes.
func TestDocsCaddyfile(t *testing.T) {
	doc, err := os.ReadFile("../docs/caddy.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "## A complete Caddyfile")
	_, rest, ok2 := strings.Cut(rest, "```caddyfile\n")
	body, _, ok3 := strings.Cut(rest, "```")
	if !ok || !ok2 || !ok3 {
		t.Fatal("docs/caddy.md has no complete Caddyfile")
	}
	cfg, err := adapt(body)
	if err != nil {
		t.Fatalf("adapting docs/caddy.md's Caddyfile: %v", err)
	}
	for _, want := range []string{`"handler":"weir"`, `"name":"gw-1"`, `"key_files":["/etc/weir/gossip.key"]`, `"handler":"reverse_proxy"`} {
		if !strings.Contains(string(cfg), want) {
			t.Errorf("the adapted config lacks %s:\n%s", want, cfg)
		}
	}
}

// The "user" identity is {http.auth.user.id}, set by basic_auth before
// weir in Caddy's directive order: each user has a bucket of their own.
func TestUserFromBasicAuth(t *testing.T) {
	hash, err := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	p := freePorts(t, 1)[0]
	load(t, global+fmt.Sprintf("http://127.0.0.1:%d {\n\tbasic_auth {\n\t\talice %s\n\t\tbob %s\n\t}\n\tweir users {\n%s\n\t}\n\trespond ok\n}\n", p, hash, hash,
		"\t\trules <<YAML\n\t\trules:\n\t\t  - id: per-user\n\t\t    key: [user]\n\t\t    limit: 1\n\t\t    window: 1h\n\t\tYAML"))
	do := func(user string) int {
		req, _ := http.NewRequest("GET", fmt.Sprintf("http://127.0.0.1:%d/", p), nil)
		req.SetBasicAuth(user, "pw")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := []int{do("alice"), do("alice"), do("bob")}; fmt.Sprint(got) != "[200 429 200]" {
		t.Errorf("alice, alice, bob: %v, want [200 429 200]", got)
	}
}

// rules_file is watched as weir watches it: an edit takes effect without a
// Caddy reload.
func TestRulesFileHotReload(t *testing.T) {
	path := t.TempDir() + "/rules.yaml"
	write := func(id string) {
		rules := "rules:\n  - id: " + id + "\n    key: [header:X-API-Key]\n    limit: 60\n    window: 1h\n    burst: 3\n"
		if err := os.WriteFile(path, []byte(rules), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("first")
	p := freePorts(t, 1)[0]
	load(t, global+site(p, "file", "\t\trules_file "+path, "ok"))
	if a := get(t, p, "k"); !strings.Contains(a.header.Get("RateLimit-Policy"), `"first"`) {
		t.Fatalf("RateLimit-Policy %q, want the rule first", a.header.Get("RateLimit-Policy"))
	}
	write("second")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if a := get(t, p, "k"); strings.Contains(a.header.Get("RateLimit-Policy"), `"second"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the edited rules file was not in force after 10s")
		}
	}
}

// A reload that Caddy refuses changes no running node: neither when a
// module's Provision fails (bad rules in another handler, a key file that
// cannot be read) nor when an app fails to start (a port another process
// holds). The running config keeps deciding with the same node, alive, on
// its rules, and an identity that spent its burst stays limited.
func TestRefusedReloadKeepsNode(t *testing.T) {
	ps := freePorts(t, 2)
	p := ps[0]
	load(t, global+site(p, "refused", perKeyRules, "one"))
	var codes []int
	for range 4 {
		codes = append(codes, get(t, p, "alice").code)
	}
	if fmt.Sprint(codes) != "[200 200 200 429]" {
		t.Fatalf("before the reloads: %v, want [200 200 200 429]", codes)
	}
	n1, _ := weircaddy.Node("refused")
	// Each refused config changes the node: its settings, or its rules.
	changed := perKeyRules + "\n\t\tmax_identity_bytes 64"
	moreBurst := strings.Replace(perKeyRules, "burst: 3", "burst: 100", 1)
	other := "\t\trules <<YAML\n\t\trules:\n\t\t  - id: other\n\t\t    key: [ip]\n\t\t    limit: 5\n\t\t    window: 1m\n\t\tYAML"
	held, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", ps[1]))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, conf, want string
	}{
		{"bad rules in another handler", global + site(p, "refused", changed, "two") +
			site(ps[1], "other", "\t\trules <<YAML\n\t\trules:\n\t\t  - id: bad\n\t\t    limit: -1\n\t\tYAML", "x"), "weir"},
		{"a key file that cannot be read", global + site(p, "refused", moreBurst, "two") +
			site(ps[1], "other", other+"\n\t\tcluster {\n\t\t\tname x\n\t\t\tkey_file "+t.TempDir()+"/missing.key\n\t\t}", "x"), "missing.key"},
		// Caddy starts a config's apps in map order: the weir app starts
		// the new node "other" before or after the http app fails.
		{"a held port, 1", global + site(p, "refused", changed, "two") + site(ps[1], "other", other, "x"), "address already in use"},
		{"a held port, 2", global + site(p, "refused", moreBurst, "two") + site(ps[1], "other", other, "x"), "address already in use"},
		{"a held port, 3", global + site(p, "refused", changed, "two") + site(ps[1], "other", other, "x"), "address already in use"},
		{"a held port, 4", global + site(p, "refused", moreBurst, "two") + site(ps[1], "other", other, "x"), "address already in use"},
	}
	for i, c := range cases {
		cfg, err := adapt(c.conf)
		if err != nil {
			t.Fatalf("%s: adapting: %v", c.name, err)
		}
		if err := caddy.Load(cfg, true); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%s: loading gave %v, want an error with %q", c.name, err, c.want)
		}
		if n, _ := weircaddy.Node("refused"); n != n1 {
			t.Errorf("%s: the refused reload replaced the node", c.name)
		}
		if _, ok := weircaddy.Node("other"); ok {
			t.Errorf("%s: the refused config's new node runs", c.name)
		}
		if a := get(t, p, "alice"); a.code != 429 || a.body == "two" {
			t.Errorf("%s: alice got %d %q, want 429 from the running config", c.name, a.code, a.body)
		}
		if a := get(t, p, fmt.Sprint("bob-", i)); a.code != 200 || a.body != "one" {
			t.Errorf("%s: a new identity got %d %q, want 200 \"one\"", c.name, a.code, a.body)
		}
	}
	held.Close()
	// The node is alive (SetRules refuses on a closed node), and putting its
	// own rules in force again keeps alice's bucket.
	rules, err := quota.Parse("rules", []byte("rules:\n  - id: per-key\n    key: [header:X-API-Key]\n    limit: 60\n    window: 1h\n    burst: 3\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := n1.SetRules(rules); err != nil {
		t.Errorf("the running node after the refused reloads: SetRules: %v", err)
	}
	if a := get(t, p, "alice"); a.code != 429 {
		t.Errorf("alice got %d, want 429", a.code)
	}
	// A reload that is not refused puts the new settings in force.
	load(t, global+site(p, "refused", moreBurst, "three")+site(ps[1], "other", other, "x"))
	if n, _ := weircaddy.Node("refused"); n != n1 {
		t.Errorf("a reload with new inline rules replaced the node")
	}
	if a := get(t, p, "alice"); a.code != 200 || a.body != "three" {
		t.Errorf("after the reload with burst 100 alice got %d %q, want 200 \"three\"", a.code, a.body)
	}
	if _, ok := weircaddy.Node("other"); !ok {
		t.Errorf("the new node other does not run")
	}
}

// A reload that changes a node's cluster settings closes it, handing its
// buckets off to the other member, and starts a new node that joins again:
// the identities that spent their burst before the reload stay limited
// after it, whichever member owned them (the envelope of a shared rule,
// B + r·Δ + S, docs/overshoot.md).
func TestSettingsChangeRejoins(t *testing.T) {
	ps := freePorts(t, 2)
	label := fmt.Sprintf("caddy-rejoin-%d", time.Now().UnixNano())
	const burst, limit = 4, 4 // per hour: r·Δ and S = 0.05·L are under one request
	rules := fmt.Sprintf("\t\trules <<YAML\n\t\trules:\n\t\t  - id: shared-key\n\t\t    key: [header:X-API-Key]\n\t\t    limit: %d\n\t\t    window: 1h\n\t\t    burst: %d\n\t\t    mode: shared\n\t\tYAML", limit, burst)
	cluster := func(name, join, extra string) string {
		s := fmt.Sprintf("%s%s\n\t\tcluster {\n\t\t\tname %s\n\t\t\tlabel %s\n\t\t\tlocal_timing\n", rules, extra, name, label)
		if join != "" {
			s += "\t\t\tjoin " + join + "\n"
		}
		return s + "\t\t}"
	}
	waitMembers := func(ids ...string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for _, id := range ids {
			n, _ := weircaddy.Node(id)
			for len(ops.Members(n)) != len(ids) {
				if time.Now().After(deadline) {
					t.Fatalf("node %s sees members %v", id, ops.Members(n))
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	load(t, global+site(ps[0], "j0", cluster("j0", "", ""), "ok"))
	n0, _ := weircaddy.Node("j0")
	g := ops.GossipAddr(n0)
	load(t, global+site(ps[0], "j0", cluster("j0", "", ""), "ok")+site(ps[1], "j1", cluster("j1", g, ""), "ok"))
	waitMembers("j0", "j1")
	n1, _ := weircaddy.Node("j1")
	const keys = 6
	admitted := make([]int, keys)
	drive := func(rounds int) {
		for k := range keys {
			for i := range rounds {
				if get(t, ps[i%2], fmt.Sprint("tenant-", k)).code == 200 {
					admitted[k]++
				}
			}
		}
	}
	drive(burst + 2)
	before := fmt.Sprint(admitted)
	// j1's identity cap is part of its settings: the reload replaces j1.
	load(t, global+site(ps[0], "j0", cluster("j0", "", ""), "ok")+site(ps[1], "j1", cluster("j1", g, "\n\t\tmax_identity_bytes 512"), "ok"))
	if n, _ := weircaddy.Node("j1"); n == n1 {
		t.Fatal("a reload that changed j1's settings kept its node")
	}
	if n, _ := weircaddy.Node("j0"); n != n0 {
		t.Fatal("the reload replaced j0, whose settings stayed")
	}
	waitMembers("j0", "j1")
	drive(burst + 2)
	t.Logf("admitted per key: %s before the reload, %v in all", before, admitted)
	for k, a := range admitted {
		if a > burst+1 || a < burst-1 {
			t.Errorf("tenant-%d: %d admitted in all, want about %d (the burst): its bucket was lost in the rejoin", k, a, burst)
		}
	}
}

// The "ip" identity is Caddy's client IP: the connection's peer, or, from a
// proxy in trusted_proxies, the address X-Forwarded-For names. Each client
// has a bucket of its own.
func TestClientIPFromTrustedProxies(t *testing.T) {
	p := freePorts(t, 1)[0]
	conf := "{\n\tadmin off\n\tauto_https off\n\tpersist_config off\n\tservers {\n\t\ttrusted_proxies static 127.0.0.1/32\n\t}\n}\n" +
		site(p, "ips", "\t\trules <<YAML\n\t\trules:\n\t\t  - id: per-ip\n\t\t    key: [ip]\n\t\t    limit: 1\n\t\t    window: 1h\n\t\tYAML", "ok")
	load(t, conf)
	do := func(xff string) int {
		req, _ := http.NewRequest("GET", fmt.Sprintf("http://127.0.0.1:%d/", p), nil)
		if xff != "" {
			req.Header.Set("X-Forwarded-For", xff)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	got := []int{do("10.0.0.1"), do("10.0.0.1"), do("10.0.0.2"), do(""), do("")}
	if fmt.Sprint(got) != "[200 429 200 200 429]" {
		t.Errorf("10.0.0.1, 10.0.0.1, 10.0.0.2, the peer, the peer: %v, want [200 429 200 200 429]", got)
	}
}

// Caddy's admin endpoint serves the running nodes (admin.api.weir) and
// Caddy's /metrics has weir's metrics, labelled with the node's id.
func TestAdminAndMetrics(t *testing.T) {
	ps := freePorts(t, 2)
	p, admin := ps[0], ps[1]
	load(t, fmt.Sprintf("{\n\tadmin 127.0.0.1:%d\n\tauto_https off\n\tpersist_config off\n}\n", admin)+site(p, "adm", perKeyRules, "ok"))
	for range 4 {
		get(t, p, "alice")
	}
	fetch := func(path string) (int, string) {
		t.Helper()
		resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d%s", admin, path))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := fetch("/weir/"); code != 200 || !strings.Contains(body, `"id":"adm"`) || !strings.Contains(body, `"rules_version":1`) {
		t.Errorf("GET /weir/: %d %s", code, body)
	}
	if code, body := fetch("/weir/adm"); code != 200 || !strings.Contains(body, `"rule": "per-key"`) || !strings.Contains(body, `"rejected": 1`) {
		t.Errorf("GET /weir/adm: %d %s", code, body)
	}
	if code, body := fetch("/weir/nope"); code != 404 || !strings.Contains(body, `no running weir node \"nope\"`) {
		t.Errorf("GET /weir/nope: %d %s", code, body)
	}
	code, body := fetch("/metrics")
	for _, want := range []string{`weir_decisions_total{node="adm",outcome="allowed",rule="per-key"} 3`, `weir_decisions_total{node="adm",outcome="rejected",rule="per-key"} 1`} {
		if code != 200 || !strings.Contains(body, want) {
			t.Errorf("GET /metrics: %d, no %s in\n%s", code, want, grepLines(body, "weir_"))
		}
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// With lease rules the node takes its rules from a lease group: a real
// one-voter group on loopback whose rules API puts a rule in force on the
// Caddy node, and a change there reaches it without a Caddy reload. The
// inline rules are the defaults until the group's rules arrive.
func TestLeaseRules(t *testing.T) {
	g, err := raftgroup.Start(raftgroup.Config{
		Name: "v1", Dir: t.TempDir(), RaftAddr: "127.0.0.1:0", RPCAddr: "127.0.0.1:0",
		Voters:           []raftgroup.Voter{{Name: "v1"}},
		Machine:          lease.Config{Regions: []string{"local"}},
		HeartbeatTimeout: 50 * time.Millisecond, ElectionTimeout: 50 * time.Millisecond,
		LeaderLeaseTimeout: 25 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	admin, err := raftgroup.AdminHandler(raftgroup.AdminConfig{Store: g, Tokens: map[string]string{"test-token-0123456789": "tester"}})
	if err != nil {
		t.Fatal(err)
	}
	api := httptest.NewServer(admin)
	defer api.Close()
	put := func(body string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			req, _ := http.NewRequest("PUT", api.URL+"/v1/rules/from-group", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer test-token-0123456789")
			resp, err := api.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("PUT a rule: %d %s", resp.StatusCode, b)
			}
		}
	}
	put(`{"limit": 60, "window": "1h", "burst": 2, "key": ["header:X-Api-Key"]}`)
	p := freePorts(t, 1)[0]
	load(t, global+site(p, "leased", "\t\trules <<YAML\n\t\trules:\n\t\t  - id: default-rule\n\t\t    key: [header:X-API-Key]\n\t\t    limit: 1000\n\t\t    window: 1h\n\t\tYAML\n\t\tlease {\n\t\t\tvoters "+g.RPCAddr()+"\n\t\t\trules\n\t\t\tcheck_interval 100ms\n\t\t}", "ok"))
	waitPolicy := func(want string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if a := get(t, p, "probe"); strings.Contains(a.header.Get("RateLimit-Policy"), want) {
				return
			}
			if time.Now().After(deadline) {
				n, _ := weircaddy.Node("leased")
				t.Fatalf("the group's rule %s was not in force after 10s: %q, status %+v", want, get(t, p, "probe").header.Get("RateLimit-Policy"), n.Status())
			}
		}
	}
	waitPolicy(`"from-group";q=60;`)
	if got := []int{get(t, p, "k").code, get(t, p, "k").code, get(t, p, "k").code}; fmt.Sprint(got) != "[200 200 429]" {
		t.Errorf("the group's rule, burst 2: %v, want [200 200 429]", got)
	}
	put(`{"limit": 600, "window": "1h", "burst": 50, "key": ["header:X-Api-Key"]}`)
	waitPolicy(`"from-group";q=600;`)
	if a := get(t, p, "k"); a.code != 200 {
		t.Errorf("after the group raised the burst: %d, want 200", a.code)
	}
	// Lease rules with a rules file are refused.
	cfg, err := adapt(global + site(p, "leased", "\t\trules_file rules.yaml\n\t\tlease {\n\t\t\tvoters "+g.RPCAddr()+"\n\t\t\trules\n\t\t}", "ok"))
	if err != nil {
		t.Fatal(err)
	}
	if err := caddy.Load(cfg, true); err == nil || !strings.Contains(err.Error(), "lease rules and rules_file are exclusive") {
		t.Errorf("lease rules with rules_file: %v", err)
	}
}

// The module registers the three Caddy modules docs/caddy.md lists.
func TestModules(t *testing.T) {
	for _, id := range []string{"admin.api.weir", "http.handlers.weir", "weir"} {
		if _, err := caddy.GetModule(id); err != nil {
			t.Errorf("module %s: %v", id, err)
		}
	}
}

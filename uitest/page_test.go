package uitest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/lease"
	"github.com/weir-dev/weir/lease/raftgroup"
	"github.com/weir-dev/weir/ops"
)

const token = "token-of-the-browser-test-operator"

// browser returns a Chromium to drive, or skips the test (fails it when
// CI=true) saying what to install.
func browser(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := "no headless browser found: run scripts/install-chromium.sh (Debian package chromium) to run the status page's browser test"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 20s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// cluster starts three gateways of one region on loopback: gw-0 is the one
// voter of the lease group and serves its rules API, gw-1 and gw-2 are its
// clients; all take their rules from the group. Each serves UIHandler.
func cluster(t *testing.T) ([]*weir.Node, []string) {
	t.Helper()
	raftL, rpcL := listen(t), listen(t)
	voters := []raftgroup.Voter{{Name: "gw-0", Addr: raftL.Addr().String()}}
	var nodes []*weir.Node
	var urls []string
	t.Cleanup(func() {
		for _, n := range nodes {
			n.Close()
		}
	})
	for i := range 3 {
		name := fmt.Sprintf("gw-%d", i)
		cc := &weir.ClusterConfig{Name: name, Region: "eu", LocalTiming: true, Label: "uitest",
			DecideTimeout: 2 * time.Second, CallTimeout: 2 * time.Second}
		lc := &weir.LeaseConfig{Rules: true, Voters: []string{rpcL.Addr().String()}, CheckInterval: time.Second,
			AdminTokens: map[string]string{token: "browser-test"}}
		if i == 0 {
			lc.Voters = nil
			lc.Voter = &raftgroup.Config{Name: name, Dir: t.TempDir(), Voters: voters,
				RPCPeers:     map[string]string{name: rpcL.Addr().String()},
				RaftListener: raftL, RPCListener: rpcL, Machine: lease.Config{Regions: []string{"eu"}},
				HeartbeatTimeout: 150 * time.Millisecond, ElectionTimeout: 150 * time.Millisecond,
				LeaderLeaseTimeout: 75 * time.Millisecond}
		} else {
			cc.Join = []string{ops.GossipAddr(nodes[0])}
		}
		n, err := weir.New(weir.Config{Cluster: cc, Lease: lc})
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, n)
		srv := httptest.NewServer(ops.UIHandler(n))
		t.Cleanup(srv.Close)
		urls = append(urls, srv.URL)
	}
	waitFor(t, "three members", func() bool {
		for _, n := range nodes {
			if len(ops.Members(n)) != 3 {
				return false
			}
		}
		return true
	})
	return nodes, urls
}

func putRule(t *testing.T, base, id, body string) {
	t.Helper()
	var code int
	// The group may still be electing its leader: 503 says retry.
	waitFor(t, "PUT "+id, func() bool {
		req, _ := http.NewRequest("PUT", base+"/v1/rules/"+id, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		code = resp.StatusCode
		return code != http.StatusServiceUnavailable
	})
	if code != http.StatusOK {
		t.Fatalf("PUT %s: %d", id, code)
	}
}

func versionsAre(nodes []*weir.Node, v uint64) func() bool {
	return func() bool {
		for _, n := range nodes {
			if n.Status().RulesVersion != v {
				return false
			}
		}
		return true
	}
}

// TestStatusPage loads the page of gw-0 in headless Chromium, sees the
// three members, changes a rule's limit through the page (the rules API,
// with the token typed into the page), sees a validation error shown next
// to the field it names, sees the new version on every member, and looks
// up a throttled identity.
func TestStatusPage(t *testing.T) {
	exe := browser(t)
	nodes, urls := cluster(t)
	putRule(t, urls[0], "per-key", `{"limit": 5, "window": "1m", "burst": 5, "key": ["header:X-Api-Key"], "match": {"prefix": "/api"}}`)
	waitFor(t, "version 1 everywhere", versionsAre(nodes, 1))

	ctx := context.Background()
	req := weir.Request{Method: "GET", Path: "/api/orders", Header: http.Header{"X-Api-Key": {"key-abuse"}}}
	rejected := 0
	for i := 0; rejected < 3 && i < 200; i++ {
		if d := nodes[i%3].Allow(ctx, req); !d.Allowed {
			rejected++
		}
	}
	if rejected < 3 {
		t.Fatal("key-abuse was never rejected")
	}

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(exe), chromedp.NoSandbox,
		chromedp.Flag("disable-gpu", true), chromedp.Flag("disable-dev-shm-usage", true))
	actx, cancelA := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelA()
	bctx, cancelB := chromedp.NewContext(actx)
	defer cancelB()
	bctx, cancelT := context.WithTimeout(bctx, 90*time.Second)
	defer cancelT()

	row := func(rule, sel string) chromedp.CSS { return chromedp.CSS(`tr[data-rule="` + rule + `"] ` + sel) }
	poll := func(expr string) chromedp.Action[chromedp.Void] {
		return chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(20*time.Second))
	}
	err := chromedp.Do(bctx,
		chromedp.Navigate(urls[0]+"/"),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-member="gw-2"]`)),
	)
	if err != nil {
		t.Fatalf("loading the page: %v", err)
	}
	members, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(`#members tbody`)))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"gw-0", "gw-1", "gw-2"} {
		if !strings.Contains(members, name) {
			t.Fatalf("members table lacks %s: %q", name, members)
		}
	}

	// A limit the API refuses: the error shows next to the limit field.
	err = chromedp.Do(bctx,
		chromedp.WaitVisible(row("per-key", "input.limit")),
		chromedp.SendKeys(chromedp.CSS(`#token`), token),
		chromedp.SetValue(row("per-key", "input.limit"), "-3"),
		chromedp.Click(row("per-key", "button.save")),
		poll(`document.querySelector('tr[data-rule="per-key"] .field-error[data-field="limit"]').textContent.length > 0`),
	)
	if err != nil {
		t.Fatalf("an invalid limit: %v", err)
	}
	limitErr, err := chromedp.Run(bctx, chromedp.Text(row("per-key", `.field-error[data-field="limit"]`)))
	if err != nil {
		t.Fatal(err)
	}
	if nodes[0].Status().RulesVersion != 1 {
		t.Fatalf("the refused change made version %d", nodes[0].Status().RulesVersion)
	}

	// A valid limit: saved as version 2, shown on every member's row.
	err = chromedp.Do(bctx,
		chromedp.SetValue(row("per-key", "input.limit"), "7"),
		chromedp.Click(row("per-key", "button.save")),
		poll(`document.querySelector('tr[data-rule="per-key"] .rule-status').textContent.includes('version 2')`),
		poll(`[...document.querySelectorAll('#members tbody tr td.version')].map(td => td.textContent).join(',') === '2,2,2'`),
	)
	if err != nil {
		t.Fatalf("changing the limit: %v", err)
	}
	status, err := chromedp.Run(bctx, chromedp.Text(row("per-key", ".rule-status")))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "version 2 everywhere", versionsAre(nodes, 2))
	if r := nodes[2].Rules().Rule(0); r.ID != "per-key" || r.Limit != 7 {
		t.Fatalf("gw-2 runs %+v, want per-key with limit 7", r)
	}

	// The identity lookup says which rule throttles key-abuse.
	err = chromedp.Do(bctx,
		chromedp.SendKeys(chromedp.CSS(`#identity-input`), "key-abuse"),
		chromedp.Click(chromedp.CSS(`#identity-go`)),
		chromedp.WaitVisible(chromedp.CSS(`#identity-verdict`)),
	)
	if err != nil {
		t.Fatalf("looking up an identity: %v", err)
	}
	verdict, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(`#identity-verdict`)))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(verdict, "throttled by: per-key") {
		t.Fatalf("lookup verdict %q", verdict)
	}
	t.Logf("limit error shown: %q; status: %q; verdict: %q", limitErr, status, verdict)
	for _, n := range nodes {
		for _, c := range ops.Counts(n) {
			if c.FailOpen != 0 {
				t.Fatalf("fail-open decisions with no fault: %+v", c)
			}
		}
	}
}

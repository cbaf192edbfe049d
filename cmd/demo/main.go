// Command demo runs weir on one node in front of a toy upstream, drives it
// with synthetic clients for a short while, and prints what each client sent,
// what was admitted, and what the rule's reference bucket expected.
//
//	go run ./cmd/demo [-duration 15s]
//
// Everything stays on 127.0.0.1. Later work extends the same demo to a
// multi-node, multi-region cluster.
package main

import (
	"bytes"
	"context"
	_ "embed"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/bucket"
	"github.com/weir-dev/weir/quota"
)

//go:embed rules.yaml
var rulesYAML []byte

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// client is one synthetic client: it sends bursts of size `burst` every
// `every`, under its own API key.
type client struct {
	name  string
	key   string
	every time.Duration
	burst int
	about string

	mu                              sync.Mutex
	sends                           []int64 // send times (unix ns), for the reference bucket
	admits                          []int64 // send times of the admitted requests, for the envelope
	sent, admitted, rejected, other atomic.Int64
	sample429                       atomic.Pointer[string]
	firstFailure                    atomic.Pointer[string] // the first request that got neither 200 nor 429
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	duration := fs.Duration("duration", 15*time.Second, "how long the synthetic clients run (the demo ends by itself)")
	addr := fs.String("addr", "127.0.0.1:0", "loopback host for the gateways (ports are picked free)")
	nodes := fs.Int("nodes", 3, "gateways in the cluster (1 runs a single node with no cluster)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *duration <= 0 || *duration > 10*time.Minute {
		fmt.Fprintln(stderr, "demo: -duration must be between 0 and 10m")
		return 2
	}
	host, _, err := net.SplitHostPort(*addr)
	if err != nil || !isLoopback(host) {
		fmt.Fprintf(stderr, "demo: -addr %q must be a loopback address such as 127.0.0.1:0\n", *addr)
		return 2
	}

	rules, err := quota.Parse("rules.yaml", rulesYAML)
	if err != nil {
		fmt.Fprintln(stderr, "demo:", err)
		return 1
	}
	if *nodes < 1 || *nodes > 9 {
		fmt.Fprintln(stderr, "demo: -nodes must be between 1 and 9")
		return 2
	}

	var upstreamCalls atomic.Int64
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upstreamCalls.Add(1)
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, "ok\n")
	})
	fleet := &fleet{rules: rules, upstream: upstream, host: host, clustered: *nodes > 1}
	for i := range *nodes {
		if err := fleet.start(i); err != nil {
			fmt.Fprintln(stderr, "demo:", err)
			fleet.stopAll()
			return 1
		}
	}
	defer fleet.stopAll()
	if fleet.clustered {
		if err := fleet.waitConverged(*nodes, 10*time.Second); err != nil {
			fmt.Fprintln(stderr, "demo:", err)
			return 1
		}
		fmt.Fprintf(stdout, "weir demo: a %d-node cluster on loopback (memberlist + peer gRPC), rules %s, running %v\n",
			*nodes, fleet.gw[0].node.Status().RulesDigest[:12], *duration)
	} else {
		fmt.Fprintf(stdout, "weir demo: one node, rules %s, running %v\n", fleet.gw[0].node.Status().RulesDigest[:12], *duration)
	}
	for _, g := range fleet.live() {
		fmt.Fprintf(stdout, "  %s: gateway %s  status page %s/ops/  admin report %s/admin/report\n", g.name, g.base, g.base, g.base)
	}
	fmt.Fprintln(stdout)

	clients := []*client{
		{name: "steady", key: "key-steady", every: 125 * time.Millisecond, burst: 1, about: "8 req/s, within its limit"},
		{name: "bursty", key: "key-bursty", every: 4 * time.Second, burst: 40, about: "40 at once every 4 s"},
		{name: "abusive", key: "key-abusive", every: 15 * time.Millisecond, burst: 1, about: "~66 req/s, far over"},
	}
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	ctx, cancel := context.WithTimeout(context.Background(), *duration)
	defer cancel()
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Add(1)
		go func() { defer wg.Done(); c.drive(ctx, hc, fleet) }()
	}
	if fleet.clustered {
		// Mid-run, the last node leaves and comes back.
		wg.Add(1)
		go func() {
			defer wg.Done()
			fleet.schedule(ctx, stdout, *nodes-1, *duration)
		}()
	}
	progress(ctx, stdout, clients, fleet)
	wg.Wait()
	hc.CloseIdleConnections()

	var perNode []string
	for _, g := range fleet.all() {
		perNode = append(perNode, fmt.Sprintf("%s %d", g.name, g.admitted.Load()))
	}
	return summarize(stdout, clients, upstreamCalls.Load(), fleet, perNode)
}

// gateway is one weir node serving HTTP in front of the upstream.
type gateway struct {
	name     string
	node     *weir.Node
	srv      *http.Server
	base     string
	admitted atomic.Int64
}

// fleet is the demo's gateways; clients spread their requests over the live
// ones.
type fleet struct {
	rules     []quota.Rule
	upstream  http.Handler
	host      string
	clustered bool

	mu   sync.Mutex
	gw   []*gateway // by index; nil while stopped
	past []*gateway // stopped gateways, for the per-node summary
	next atomic.Uint64
}

func (f *fleet) start(i int) error {
	// The canary probes weir-canary (rules.yaml) 4 times a second and
	// exports whether it still sees rejections (weir_canary_ok).
	cfg := weir.Config{Rules: f.rules, Canary: &weir.CanaryConfig{Rule: "weir-canary"}}
	name := fmt.Sprintf("gw-%d", i)
	if f.clustered {
		cc := &weir.ClusterConfig{Name: name, Region: "demo", LocalTiming: true, Label: "weir-demo",
			GossipAddr: net.JoinHostPort(f.host, "0"), RPCAddr: net.JoinHostPort(f.host, "0")}
		f.mu.Lock()
		for _, g := range f.gw {
			if g != nil {
				cc.Join = []string{g.node.GossipAddr()}
				break
			}
		}
		f.mu.Unlock()
		cfg.Cluster = cc
	}
	node, err := weir.New(cfg)
	if err != nil {
		return err
	}
	g := &gateway{name: name, node: node}
	counting := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.admitted.Add(1)
		f.upstream.ServeHTTP(w, r)
	})
	mux := http.NewServeMux()
	mux.Handle("/api/", node.Middleware(counting))
	mux.Handle("/admin/report", node.AdminHandler())
	// The status page, its JSON and the identity lookup, for operators.
	mux.Handle("/ops/", http.StripPrefix("/ops", node.UIHandler()))
	ln, err := net.Listen("tcp", net.JoinHostPort(f.host, "0"))
	if err != nil {
		node.Close()
		return err
	}
	g.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go g.srv.Serve(ln)
	g.base = "http://" + ln.Addr().String()
	f.mu.Lock()
	for len(f.gw) <= i {
		f.gw = append(f.gw, nil)
	}
	f.gw[i] = g
	f.mu.Unlock()
	return nil
}

// stop takes gateway i out of the clients' rotation, drains it and closes
// its node (which reports its unconfirmed spend and leaves the ring).
func (f *fleet) stop(i int) {
	f.mu.Lock()
	g := f.gw[i]
	f.gw[i] = nil
	if g != nil {
		f.past = append(f.past, g)
	}
	f.mu.Unlock()
	if g == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = g.srv.Shutdown(ctx)
	g.node.Close()
}

func (f *fleet) stopAll() {
	f.mu.Lock()
	n := len(f.gw)
	f.mu.Unlock()
	for i := range n {
		f.stop(i)
	}
}

func (f *fleet) live() []*gateway {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*gateway
	for _, g := range f.gw {
		if g != nil {
			out = append(out, g)
		}
	}
	return out
}

// all returns every gateway that ran, stopped ones included.
func (f *fleet) all() []*gateway {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := append([]*gateway(nil), f.past...)
	for _, g := range f.gw {
		if g != nil {
			out = append(out, g)
		}
	}
	return out
}

// pick returns the next live gateway's base URL, round-robin.
func (f *fleet) pick() string {
	l := f.live()
	if len(l) == 0 {
		return ""
	}
	return l[int(f.next.Add(1)%uint64(len(l)))].base
}

func (f *fleet) waitConverged(n int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		ok := true
		for _, g := range f.live() {
			if len(g.node.Members()) != n {
				ok = false
			}
		}
		if ok {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("the %d nodes did not see each other within %v", n, limit)
}

// schedule stops gateway i at a third of the run and starts it again at
// two thirds.
func (f *fleet) schedule(ctx context.Context, w io.Writer, i int, run time.Duration) {
	select {
	case <-ctx.Done():
		return
	case <-time.After(run / 3):
	}
	f.stop(i)
	fmt.Fprintf(w, "-- gw-%d left the cluster (graceful: its unconfirmed spend was reported first)\n", i)
	select {
	case <-ctx.Done():
		return
	case <-time.After(run / 3):
	}
	if err := f.start(i); err != nil {
		fmt.Fprintf(w, "-- gw-%d failed to restart: %v\n", i, err)
		return
	}
	fmt.Fprintf(w, "-- gw-%d restarted and rejoined\n", i)
}

func isLoopback(host string) bool {
	ip := net.ParseIP(host)
	return host == "localhost" || (ip != nil && ip.IsLoopback())
}

// drive sends the client's traffic until ctx ends.
func (c *client) drive(ctx context.Context, hc *http.Client, f *fleet) {
	t := time.NewTicker(c.every)
	defer t.Stop()
	for {
		var wg sync.WaitGroup
		for range c.burst {
			wg.Add(1)
			go func() { defer wg.Done(); c.send(ctx, hc, f.pick) }()
		}
		wg.Wait()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (c *client) send(ctx context.Context, hc *http.Client, pick func() string) {
	sent := time.Now().UnixNano()
	c.mu.Lock()
	c.sends = append(c.sends, sent)
	c.mu.Unlock()
	// A gateway taken out of rotation just after it was picked refuses
	// the connection; like a load balancer, try the next one (the request
	// never reached a decision there).
	var resp *http.Response
	var err error
	for range 3 {
		// The request outlives the run's context: one sent just before
		// the end is answered and counted, so admitted matches the
		// upstream's count.
		req, _ := http.NewRequestWithContext(context.WithoutCancel(ctx), http.MethodGet, pick()+"/api/items", nil)
		req.Header.Set("X-API-Key", c.key)
		if resp, err = hc.Do(req); err == nil {
			break
		}
	}
	if err != nil {
		msg := err.Error()
		c.firstFailure.CompareAndSwap(nil, &msg)
		c.other.Add(1)
		c.mu.Lock()
		c.sends = c.sends[:len(c.sends)-1] // never reached the gateway's decision
		c.mu.Unlock()
		return
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	c.sent.Add(1)
	switch resp.StatusCode {
	case http.StatusOK:
		c.admitted.Add(1)
		c.mu.Lock()
		c.admits = append(c.admits, sent)
		c.mu.Unlock()
	case http.StatusTooManyRequests:
		c.rejected.Add(1)
		if c.sample429.Load() == nil {
			s := fmt.Sprintf("HTTP 429  Retry-After: %s  X-RateLimit-Remaining: %s  RateLimit: %s\n      %s",
				resp.Header.Get("Retry-After"), resp.Header.Get("X-RateLimit-Remaining"), resp.Header.Get("RateLimit"), body)
			c.sample429.Store(&s)
		}
	default:
		msg := fmt.Sprintf("HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(body))
		c.firstFailure.CompareAndSwap(nil, &msg)
		c.other.Add(1)
	}
}

// progress prints one line a second until ctx ends.
func progress(ctx context.Context, w io.Writer, clients []*client, f *fleet) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	start := time.Now()
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintln(w)
			return
		case <-t.C:
			fmt.Fprintf(w, "t=%3.0fs", time.Since(start).Seconds())
			for _, c := range clients {
				fmt.Fprintf(w, "  %s %d/%d", c.name, c.admitted.Load(), c.sent.Load())
			}
			fmt.Fprintf(w, "  live nodes %d\n", len(f.live()))
		}
	}
}

// expected feeds the client's send times, in order, to the reference: one
// exact GCRA bucket for the api-per-key rule (600/min, burst 20). The global
// rule never binds at this load, and the shadow rule never rejects.
func (c *client) expected() int64 {
	g, err := bucket.NewGCRA(600, time.Minute, 20)
	if err != nil {
		panic(err)
	}
	c.mu.Lock()
	sends := append([]int64(nil), c.sends...)
	c.mu.Unlock()
	sort.Slice(sends, func(i, j int) bool { return sends[i] < sends[j] })
	var tat bucket.TAT
	var n int64
	for _, t := range sends {
		if g.Step(&tat, t, 1).Allowed {
			n++
		}
	}
	return n
}

// worstExcess is the largest amount by which the client's admissions over
// any interval exceed r·Δ (r = 10 tokens/s, the api-per-key rule's rate):
// DESIGN.md bounds it by B + S.
func (c *client) worstExcess() float64 {
	c.mu.Lock()
	ts := append([]int64(nil), c.admits...)
	c.mu.Unlock()
	sort.Slice(ts, func(i, j int) bool { return ts[i] < ts[j] })
	const rate = 10.0 / float64(time.Second)
	worst, minStart := 0.0, 0.0
	for i, t := range ts {
		if v := float64(i) - rate*float64(t-ts[0]); i == 0 || v < minStart {
			minStart = v
		}
		if v := float64(i+1) - rate*float64(t-ts[0]) - minStart; v > worst {
			worst = v
		}
	}
	return worst
}

func summarize(w io.Writer, clients []*client, upstream int64, f *fleet, perNode []string) int {
	// The envelope of DESIGN.md for api-per-key (600/min, burst 20,
	// accuracy 5 %): the cluster may exceed the reference by S, the slack of
	// the non-owner nodes, and fall short by S plus a token of timing.
	n := int64(len(f.gw))
	slack := int64(0)
	if f.clustered {
		slack = (n - 1) * (600 * 5 / 100 / n)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "client\tsent\tadmitted\trejected\treference\tdifference\tworst excess over r·Δ\tenvelope B + S\t")
	var admitted int64
	ok := true
	for _, c := range clients {
		exp := c.expected()
		diff := c.admitted.Load() - exp
		admitted += c.admitted.Load()
		// The envelope: over any interval at most B + r·Δ + S. Times are
		// the clients' send times; the gateways decide a fraction of a
		// millisecond later, so allow two tokens of timing.
		excess := c.worstExcess()
		bound := float64(20 + slack + 2)
		mark := "held"
		if excess > bound || c.other.Load() > 0 {
			mark = "BROKEN"
			ok = false
		}
		// A saturating client must also not be starved: at least the
		// reference less S and timing.
		if c.name == "abusive" && diff < -slack-2 {
			mark = "STARVED"
			ok = false
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%+d\t%.1f\t%.0f %s\t\n", c.name, c.sent.Load(), c.admitted.Load(), c.rejected.Load(), exp, diff, excess, bound, mark)
	}
	tw.Flush()
	fmt.Fprintln(w)
	for _, c := range clients {
		fmt.Fprintf(w, "%-8s %s\n", c.name, c.about)
		if s := c.sample429.Load(); s != nil {
			fmt.Fprintf(w, "  e.g. %s", *s)
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "upstream calls: %d (admitted: %d; a rejected request never reaches the upstream)\n", upstream, admitted)
	if upstream != admitted {
		ok = false
	}
	if f.clustered {
		fmt.Fprintf(w, "admitted per node: %s (S = %d tokens of slack over the non-owner nodes)\n", strings.Join(perNode, ", "), slack)
	}
	totals := map[string]*weir.RuleCounts{}
	var ids []string
	var failOpen uint64
	for _, g := range f.all() {
		for _, rc := range g.node.Counts() {
			t, seen := totals[rc.Rule]
			if !seen {
				t = &weir.RuleCounts{Rule: rc.Rule}
				totals[rc.Rule] = t
				ids = append(ids, rc.Rule)
			}
			t.Allowed += rc.Allowed
			t.Rejected += rc.Rejected
			t.ShadowRejected += rc.ShadowRejected
			t.FailOpen += rc.FailOpen
			failOpen += rc.FailOpen
		}
	}
	sort.Strings(ids)
	fmt.Fprintln(w, "rule counts, all nodes:")
	for _, id := range ids {
		rc := totals[id]
		fmt.Fprintf(w, "  %-18s allowed %6d  rejected %6d  shadow-rejected %6d  fail-open %d\n", rc.Rule, rc.Allowed, rc.Rejected, rc.ShadowRejected, rc.FailOpen)
	}
	if top := f.all()[0].node.TopThrottled(); len(top) > 0 {
		fmt.Fprintf(w, "top throttled on %s: %s under %s (~%.0f recent rejections)\n", f.all()[0].name, top[0].Identity, top[0].Rule, top[0].Count)
	}
	for _, g := range f.live() {
		c := g.node.Canary()
		state := "ok (sees rejections)"
		if !c.OK {
			state = "NOT OK: no rejection seen within its window"
		}
		fmt.Fprintf(w, "canary on %s: %s, %d of %d probes rejected\n", g.name, state, c.Rejected, c.Allowed+c.Rejected+c.Errors)
	}
	if !ok {
		for _, c := range clients {
			if f := c.firstFailure.Load(); f != nil {
				fmt.Fprintf(w, "%s: %d requests failed; the first: %s\n", c.name, c.other.Load(), *f)
			}
		}
		fmt.Fprintln(w, "RESULT: a client's admissions left the envelope, or requests failed")
		return 1
	}
	fmt.Fprintf(w, "RESULT: the envelope held for every client (over any interval at most B + r·Δ + S, S = %d); fail-open decisions: %d\n", slack, failOpen)
	return 0
}

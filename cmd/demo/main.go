// Command demo runs the whole of weir on one machine, in one process, on
// loopback: by default two regions of three gateway nodes (a memberlist
// ring and peer gRPC per region) and a lease group of three voters (Raft
// on raft-boltdb in a temporary directory, removed at the end), each
// gateway in front of a toy upstream. The rules live in the lease group.
// Synthetic clients, each with its own identity, drive the gateways while a
// schedule stops and restarts a node, tightens a rule through the
// authenticated admin API, shifts a global customer's traffic from one
// region to the other, and kills the lease leader. At the end it prints
// one sentence per client (what it was admitted of what it sent, beside
// what one exact bucket per identity would have admitted) and per global
// rule, and whether the accuracy contract of docs/overshoot.md and
// docs/global.md held; -v adds the details (the bound each client was
// checked against over every interval, the nodes' counters per rule). It
// exits non-zero if the contract did not hold or a step failed.
//
//	go run ./cmd/demo                                  # 2 regions × 3 nodes, about a minute
//	go run ./cmd/demo -duration 20s -v
//	go run ./cmd/demo -duration 4s -regions 1 -nodes 1 # one node: no cluster, no lease group
//
// Everything listens on 127.0.0.1 (or the loopback host of -addr) on ports
// picked free; nothing is sent anywhere else. Requests to the printed
// gateways from outside the demo are welcome: they are counted apart and
// do not change its verdict. The warnings the demo's own steps cause (a
// PUT it sends without a token, reports failing while it has killed the
// lease leader) are counted in the summary rather than shown.
package main

import (
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/weir-dev/weir/quota"
)

//go:embed rules.yaml
var rulesYAML []byte

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, isTerminal(os.Stdout)))
}

// isTerminal reports whether f is a character device (a terminal), where
// the demo redraws a live table; elsewhere it prints plain lines.
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func run(args []string, stdout, stderr io.Writer, tty bool) int {
	o, ok := parseFlags(args, stderr)
	if !ok {
		return 2
	}
	rules, err := quota.Parse("rules.yaml", rulesYAML)
	if err != nil {
		fmt.Fprintln(stderr, "demo:", err)
		return 1
	}

	// The toy upstream counts the calls of the demo's own requests apart
	// from the others' (someone trying a gateway it printed): only the
	// former must match what its clients were admitted.
	tag := randomHex()
	var upstream upstreamCalls
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(demoHeader) == tag {
			upstream.ours.Add(1)
		} else {
			upstream.outside.Add(1)
		}
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, "ok\n")
	})
	out := &printer{w: stdout, tty: tty, start: time.Now()}
	logs := stderr
	if tty {
		logs = out // above the live table, which a stray line would break
	}
	f, err := newFleet(o.host, o.regions, o.nodes, rules, handler, logs)
	if err != nil {
		fmt.Fprintln(stderr, "demo:", err)
		return 1
	}
	f.tag = tag
	defer f.stopAll()
	t0 := time.Now()
	version, err := bringUp(f)
	if err != nil {
		fmt.Fprintln(stderr, "demo:", err)
		return 1
	}
	header(out, f, o.nodes, version, o.duration, time.Since(t0))

	clients := newClients(o.regions)
	mon := &monitor{f: f, clients: clients, out: out, global: "partner-global"}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer hc.CloseIdleConnections()
	// Ctrl-C ends the run early: the summary is still printed and the
	// temporary directory removed.
	interrupted, stopSignals := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stopSignals()
	sched, ld := runWorkload(interrupted, hc, f, out, clients, mon, rules, o.duration)
	return summarize(stdout, f, clients, rules, sched, mon, &upstream, ld, o.nodes, o.verbose)
}

// upstreamCalls counts the toy upstream's calls: ours carry the demo's
// tag, the others came from outside the demo.
type upstreamCalls struct {
	ours, outside atomic.Int64
}

// options are the demo's command-line flags, checked.
type options struct {
	duration       time.Duration
	regions, nodes int
	// host is the loopback IP every listener binds.
	host string
	// verbose prints the detailed tables after the summary: the bounds
	// each client was checked against, the nodes' counters per rule.
	verbose bool
}

// parseFlags parses and checks the command line; on a problem it says what
// is wrong on stderr and returns false (exit status 2).
func parseFlags(args []string, stderr io.Writer) (options, bool) {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	duration := fs.Duration("duration", time.Minute, "how long the synthetic clients run; the demo ends by itself and scales its schedule to this. "+
		"The clients offer about 110 requests/s in all: on a 2-core machine the whole process uses about a fifth of one core, "+
		"so gossip and Raft are never starved (the summary prints the measured CPU use and load average)")
	regions := fs.Int("regions", 2, "regions, 1 or 2")
	nodes := fs.Int("nodes", 3, "gateway nodes per region (1 to 5); -regions 1 -nodes 1 runs a single node: no cluster, no lease group")
	verbose := fs.Bool("v", false, "after the summary, print the details: the bound each client was checked against over every interval "+
		"(r·Δ + B + S + timing + F, and the terms of the ring changes), the nodes' counters per rule, every canary")
	addr := fs.String("addr", "127.0.0.1:0", "loopback host for every listener, as host:port (the port is ignored: ports are picked free)")
	if err := fs.Parse(args); err != nil {
		return options{}, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "demo: unexpected arguments %q\n", fs.Args())
		return options{}, false
	}
	if *duration < 2*time.Second || *duration > 10*time.Minute {
		fmt.Fprintln(stderr, "demo: -duration must be between 2s and 10m")
		return options{}, false
	}
	if *regions < 1 || *regions > 2 {
		fmt.Fprintln(stderr, "demo: -regions must be 1 or 2")
		return options{}, false
	}
	if *nodes < 1 || *nodes > 5 {
		fmt.Fprintln(stderr, "demo: -nodes must be between 1 and 5")
		return options{}, false
	}
	host, _, err := net.SplitHostPort(*addr)
	if err != nil || !isLoopback(host) {
		fmt.Fprintf(stderr, "demo: -addr %q must be a loopback address such as 127.0.0.1:0\n", *addr)
		return options{}, false
	}
	if host == "localhost" {
		host = "127.0.0.1" // memberlist binds an IP
	}
	return options{duration: *duration, regions: *regions, nodes: *nodes, host: host, verbose: *verbose}, true
}

// bringUp starts every node of the fleet and, in a cluster, waits until the
// regions' rings have converged and the lease group holds the initial
// rules, so that the clients start against a settled fleet. It returns the
// rules' version in the lease group (0 without one).
func bringUp(f *fleet) (uint64, error) {
	for _, name := range f.nodeNames() {
		g, err := f.start(name)
		if err != nil {
			return 0, err
		}
		f.enter(g)
	}
	if !f.clustered {
		return 0, nil
	}
	if !waitFor(15*time.Second, f.converged) {
		return 0, errors.New("the regions' rings did not converge within 15s")
	}
	return f.seed(30 * time.Second)
}

// runWorkload runs the synthetic clients, the monitor and the schedule for
// d, or until interrupted, and returns the scheduler (what it did) and the
// load the run put on the machine. The clients go on past d while a
// scheduled step that started late (on a busy machine) has not finished,
// but never past twice d: the schedule's own context.
func runWorkload(interrupted context.Context, hc *http.Client, f *fleet, out *printer, clients []*client, mon *monitor, rules []quota.Rule, d time.Duration) (*scheduler, load) {
	schedCtx, schedCancel := context.WithTimeout(interrupted, 2*d)
	defer schedCancel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	out.mu.Lock()
	out.start = start // the events' t= counts from here
	out.mu.Unlock()
	cpu0, cpuOK := cpuTime()
	sched := &scheduler{f: f, out: out, start: start, run: d}
	var clientsDone, others sync.WaitGroup
	for i, c := range clients {
		clientsDone.Go(func() { c.drive(ctx, hc, f, start, d, uint64(i+1)) })
	}
	schedDone := make(chan struct{})
	others.Go(func() { mon.run(ctx, start) })
	others.Go(func() { defer close(schedDone); sched.runSchedule(schedCtx, rules) })
	select {
	case <-time.After(d):
	case <-schedCtx.Done():
	}
	if interrupted.Err() != nil {
		out.event("interrupted: stopping the clients")
	}
	select {
	case <-schedDone:
	default:
		out.event("the run goes on until the scheduled step in progress ends (at most %v in all)", 2*d)
		<-schedDone
	}
	cancel()
	clientsDone.Wait()
	wall := time.Since(start)
	cpu1, _ := cpuTime()
	others.Wait()

	var sent int64
	for _, c := range clients {
		sent += c.sent.Load()
	}
	ld := load{wall: wall, cpu: cpu1 - cpu0, cpuOK: cpuOK, offeredRPS: float64(sent) / wall.Seconds()}
	ld.avg1, ld.avgOK = loadAverage()
	return sched, ld
}

// header prints what runs where, and how to talk to it.
func header(out *printer, f *fleet, perRegion int, version uint64, d, took time.Duration) {
	if !f.clustered {
		out.printf("weir demo: one node, no cluster, no lease group; rules inline (%d); running %v\n", len(f.rules), d)
	} else {
		var voters []string
		for _, v := range f.voters {
			voters = append(voters, v.Name)
		}
		ldr, _ := f.leader()
		out.printf("weir demo: %d region(s) × %d nodes on loopback (a memberlist ring and peer gRPC per region), a lease group of %d voter(s) %v (Raft on raft-boltdb, leader %s); rules v%d from the lease group; ready in %v; running %v\n",
			len(f.regions), perRegion, len(f.voters), voters, ldr, version, took.Round(time.Millisecond), d)
	}
	for _, g := range f.gateways() {
		role := "lease client"
		switch {
		case !f.clustered:
			role = "single node"
		case g.voter:
			role = "lease voter"
		}
		out.printf("  %-5s %-3s %-12s gateway %s  (/api/, /partner/, /admin/report, /v1/rules)  status page %s/ops/\n", g.name, g.region, role, g.base, g.base)
	}
	if f.clustered {
		g := f.gateways()[0]
		out.printf("  admin API token for this run: %s\n    curl -s %s/v1/rules -H 'Authorization: Bearer %s'\n", f.token, g.base, f.token)
	}
	out.printf("\n")
}

func isLoopback(host string) bool {
	ip := net.ParseIP(host)
	return host == "localhost" || (ip != nil && ip.IsLoopback())
}
